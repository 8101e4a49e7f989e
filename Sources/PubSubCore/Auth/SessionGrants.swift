import NIOConcurrencyHelpers

/// This node's copy of its sessions' grants (a JWT connection token's user, expiry and channel claims), by
/// clientId. The engine holds the grant of record (`Engine.setGrant`), so a session that moves to another node
/// keeps it; a node reads it once per session and remembers it here, including that a session has none.
///
/// An entry goes at `/meta/disconnect`, when its expiry is enforced at a connect, and when a prune finds its
/// session gone (prunes run when the table has doubled since the last one, so the cost is amortised).
public final class SessionGrants: Sendable {
    private struct State {
        var grants: [String: SessionGrant?] = [:]
        var pruneAt = 1024
    }

    private let state = NIOLockedValueBox(State())

    public init() {}

    /// The known grant: `.some(nil)` when the session is known to have none, nil when this node has not looked.
    public func lookup(_ clientId: String) -> SessionGrant?? {
        state.withLockedValue { $0.grants[clientId] }
    }

    public var count: Int { state.withLockedValue { $0.grants.count } }

    /// Remembers a session's grant (or that it has none); returns the ids to check for a prune when the table has
    /// grown enough to need one.
    @discardableResult
    public func insert(_ grant: SessionGrant?, for clientId: String) -> [String]? {
        state.withLockedValue { state in
            state.grants[clientId] = .some(grant)
            guard state.grants.count >= state.pruneAt else { return nil }
            state.pruneAt = state.grants.count * 2
            return Array(state.grants.keys)
        }
    }

    public func remove(_ clientId: String) {
        _ = state.withLockedValue { $0.grants.removeValue(forKey: clientId) }
    }

    /// After a prune: the table may shrink, so the next prune comes when it has doubled from here.
    public func pruned() {
        state.withLockedValue { $0.pruneAt = max(1024, $0.grants.count * 2) }
    }
}
