import JWTKit
import PubSubCore

/// The claims pubsub reads from a token. Time claims are checked by `JWTRules` against the broker's clock (an
/// input, so tests can move it), not by jwt-kit's own `verify`.
public struct JWTClaims: JWTPayload, Equatable {
    /// The user (required in every token pubsub accepts).
    public var sub: String?
    /// Expiry and not-before, seconds since the Unix epoch.
    public var exp: Double?
    public var nbf: Double?
    /// A connection token: subscription patterns the session may hold, and patterns it may publish to.
    public var channels: [String]?
    public var publish: [String]?
    /// A subscription token: the one subscription it grants.
    public var channel: String?

    public init(
        sub: String? = nil, exp: Double? = nil, nbf: Double? = nil, channels: [String]? = nil,
        publish: [String]? = nil, channel: String? = nil
    ) {
        self.sub = sub
        self.exp = exp
        self.nbf = nbf
        self.channels = channels
        self.publish = publish
        self.channel = channel
    }

    public func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// Why a token was refused; the text is the message part of the Bayeux error.
public enum JWTRefusal: String, Error, Sendable, Equatable {
    case invalid = "Invalid token"
    case expired = "Token expired"
    case notYetValid = "Token not yet valid"
    case noSubject = "Token has no subject"
    case otherUser = "Token is for another user"
    case otherChannel = "Token is for another channel"
    case notGranted = "No token grants this channel"
}

/// The JWT decision tables, pure: claims (already verified) × channel × time.
public enum JWTRules {
    /// The time checks every token passes: `exp` (strictly in the future) and `nbf`.
    public static func checkTime(_ claims: JWTClaims, now: Double) -> JWTRefusal? {
        if let exp = claims.exp, now >= exp { return .expired }
        if let nbf = claims.nbf, now < nbf { return .notYetValid }
        return nil
    }

    /// A connection token presented at the handshake: what the session is granted.
    public static func connection(_ claims: JWTClaims, now: Double) -> Result<SessionGrant, JWTRefusal> {
        if let refusal = checkTime(claims, now: now) { return .failure(refusal) }
        guard let sub = claims.sub, !sub.isEmpty else { return .failure(.noSubject) }
        return .success(
            SessionGrant(user: sub, expiresAt: claims.exp, channels: claims.channels ?? [], publish: claims.publish ?? []))
    }

    /// A subscription token: its `sub` must be the session's user and its `channel` the subscription.
    public static func subscription(_ claims: JWTClaims, channel: String, sessionUser: String?, now: Double)
        -> JWTRefusal?
    {
        if let refusal = checkTime(claims, now: now) { return refusal }
        guard let sub = claims.sub, !sub.isEmpty else { return .noSubject }
        guard let sessionUser, sub == sessionUser else { return .otherUser }
        guard claims.channel == channel else { return .otherChannel }
        return nil
    }

    /// A subscription without a token of its own: the session's connection token must grant it, and must not
    /// have expired.
    public static func subscribe(_ grant: SessionGrant?, channel: String, now: Double) -> JWTRefusal? {
        covers(grant?.channels, channel, grant: grant, now: now)
    }

    /// A publish: the session's connection token's `publish` patterns must cover the channel.
    public static func publish(_ grant: SessionGrant?, channel: String, now: Double) -> JWTRefusal? {
        covers(grant?.publish, channel, grant: grant, now: now)
    }

    static func covers(_ patterns: [String]?, _ channel: String, grant: SessionGrant?, now: Double) -> JWTRefusal? {
        guard let grant, let patterns else { return .notGranted }
        if let expiresAt = grant.expiresAt, now >= expiresAt { return .expired }
        return patterns.contains { PrivatePubAuth.pattern($0, covers: channel) } ? nil : .notGranted
    }
}
