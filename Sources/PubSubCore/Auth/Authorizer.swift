import Bayeux
import NIOCore

/// What a client asks to do, as an authorizer sees it.
public enum AuthorizationAction: String, Sendable, CaseIterable, Hashable {
    case handshake, subscribe, publish
}

/// What a session was granted when it handshook (a JWT connection token's claims), kept by the broker
/// for the session's later subscribes, publishes and connects.
public struct SessionGrant: Sendable, Equatable {
    public var user: String
    /// Seconds since the Unix epoch after which the session must handshake again; nil: never.
    public var expiresAt: Double?
    /// Subscription patterns the session may hold (`/jobs/42`, `/users/42/**`).
    public var channels: [String]
    /// Patterns it may publish to.
    public var publish: [String]

    public init(user: String, expiresAt: Double? = nil, channels: [String] = [], publish: [String] = []) {
        self.user = user
        self.expiresAt = expiresAt
        self.channels = channels
        self.publish = publish
    }
}

/// One question to one authorizer: may this client do `action` on `channel`?
public struct AuthorizationRequest: Sendable {
    public var action: AuthorizationAction
    /// Absent for a handshake (the session does not exist yet) and for a publish without a session.
    public var clientId: String?
    /// The one subscription being decided (a subscribe naming several asks once per channel), the channel
    /// published to; nil for a handshake.
    public var channel: String?
    /// The whole message as it arrived (its `ext` carries signatures and tokens).
    public var message: Message
    /// The session's user, when a mode established one (at a handshake: the user an earlier mode established).
    public var user: String?
    /// What the session was granted at its handshake, if a mode granted anything.
    public var grant: SessionGrant?
    public var context: RequestContext

    public init(
        action: AuthorizationAction, clientId: String?, channel: String?, message: Message, user: String? = nil,
        grant: SessionGrant? = nil, context: RequestContext
    ) {
        self.action = action
        self.clientId = clientId
        self.channel = channel
        self.message = message
        self.user = user
        self.grant = grant
        self.context = context
    }
}

/// One authorizer's answer.
public enum AuthorizationDecision: Sendable, Equatable {
    /// Accepted. At a handshake, `user` becomes the session's user and `grant` is kept for the session.
    case allow(user: String? = nil, grant: SessionGrant? = nil)
    /// Refused: this mode's credentials were presented and are wrong, or the mode itself said no. The text is
    /// the reply's `error` when no other mode accepts.
    case deny(String)
    /// This mode has nothing to go on (none of its credentials were presented). The text is the reply's `error`
    /// when no mode accepts and none refused outright.
    case abstain(String)
}

/// One authorization mode (PrivatePub signatures, public patterns, JWT, the HTTP hook). Modes combine in an
/// `AuthorizationPipeline`: a subscribe or publish is accepted when any one of them accepts it.
///
/// An authorizer that must wait (the hook) completes its future later and never blocks the event loop; one that
/// decides at once returns a succeeded future.
public protocol Authorizer: Sendable {
    /// For logs and metrics: `privatepub`, `public`, `jwt`, `hook`.
    var name: String { get }
    /// The actions this mode decides; it is never asked about others.
    var actions: Set<AuthorizationAction> { get }
    /// Whether it needs the session's user (read from the engine when no grant names it).
    var needsUser: Bool { get }
    /// Whether its handshake acceptances carry a `SessionGrant` the broker must keep and enforce (JWT).
    var grantsSessions: Bool { get }
    func authorize(_ request: AuthorizationRequest, on loop: any EventLoop) -> EventLoopFuture<AuthorizationDecision>
    /// Removes this mode's credentials from a message that is about to be published, so that subscribers never
    /// receive them (PrivatePub's publish token).
    func scrub(_ message: inout Message)
}

extension Authorizer {
    public var needsUser: Bool { false }
    public var grantsSessions: Bool { false }
    public func scrub(_ message: inout Message) {}
}
