import NIOConcurrencyHelpers

/// The grants of this node's sessions (a JWT connection token's user, expiry and channel claims), by clientId.
///
/// Kept in memory on the node that took the handshake: the claims are not part of the shared session. An
/// entry goes at `/meta/disconnect`, when its expiry is enforced at a connect, and when a prune finds its
/// session gone (prunes run when the table has doubled since the last one, so the cost is amortised).
public final class SessionGrants: Sendable {
    private struct State {
        var grants: [String: SessionGrant] = [:]
        var pruneAt = 1024
    }

    private let state = NIOLockedValueBox(State())

    public init() {}

    public subscript(clientId: String) -> SessionGrant? {
        state.withLockedValue { $0.grants[clientId] }
    }

    public var count: Int { state.withLockedValue { $0.grants.count } }

    /// Stores a grant; returns the ids to check for a prune when the table has grown enough to need one.
    @discardableResult
    public func insert(_ grant: SessionGrant, for clientId: String) -> [String]? {
        state.withLockedValue { state in
            state.grants[clientId] = grant
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
