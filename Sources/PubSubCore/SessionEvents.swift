/// A change in a session's life that an app may want to hear about (webhooks): a handshake, a channel
/// subscribed or unsubscribed, the end of the session. Reported by the engine that made the change, on the node
/// where it happened, after the engine's lock is released; never on the publish path except for a client that
/// a publish dropped for overflow.
public struct SessionEvent: Sendable, Equatable {
    public enum Kind: String, Sendable, Equatable, CaseIterable {
        case handshake
        case subscribe
        case unsubscribe
        case disconnect
    }

    /// Why a session ended, as webhooks name it.
    public enum EndReason: String, Sendable, Equatable {
        /// No `/meta/connect` for `2 × timeout`.
        case expired
        /// Its queue overflowed and it was dropped.
        case overflow
        /// Removed by the server API.
        case kicked
        /// The client sent `/meta/disconnect`.
        case client

        /// The reason an engine's `DetachReason` is reported under; nil for a detach that does not end the session.
        public init?(_ reason: DetachReason) {
            switch reason {
            case .expired: self = .expired
            case .overflow: self = .overflow
            case .kicked: self = .kicked
            case .disconnected: self = .client
            case .superseded, .shutdown: return nil
            }
        }
    }

    public var kind: Kind
    public var clientId: String
    /// The channel (or pattern) of a subscribe or an unsubscribe; nil otherwise.
    public var channel: String?
    /// The identity authentication established for the session; nil when there is none.
    public var user: String?
    /// Why the session ended, for a disconnect.
    public var reason: EndReason?

    public init(kind: Kind, clientId: String, channel: String? = nil, user: String? = nil, reason: EndReason? = nil) {
        self.kind = kind
        self.clientId = clientId
        self.channel = channel
        self.user = user
        self.reason = reason
    }
}

/// Where an engine reports session events. Called outside every engine lock, on whatever thread made the
/// change (an event loop): it must only hand the events over (a bounded queue), never block or do I/O.
public protocol SessionEventObserver: AnyObject, Sendable {
    func sessionEvents(_ events: [SessionEvent])
}
