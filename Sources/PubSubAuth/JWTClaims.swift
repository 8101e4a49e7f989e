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
    /// Checked when the broker is configured with an audience or an issuer (`--jwt-audience`, `--jwt-issuer`).
    public var aud: Audience?
    public var iss: String?

    /// `aud`: one string or an array of them (RFC 7519 4.1.3).
    public struct Audience: Codable, Sendable, Equatable {
        public var values: [String]
        public init(_ values: [String]) { self.values = values }
        public init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let one = try? container.decode(String.self) {
                values = [one]
            } else {
                values = try container.decode([String].self)
            }
        }
        public func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            if values.count == 1 { try container.encode(values[0]) } else { try container.encode(values) }
        }
    }

    public init(
        sub: String? = nil, exp: Double? = nil, nbf: Double? = nil, channels: [String]? = nil,
        publish: [String]? = nil, channel: String? = nil, aud: Audience? = nil, iss: String? = nil
    ) {
        self.sub = sub
        self.exp = exp
        self.nbf = nbf
        self.channels = channels
        self.publish = publish
        self.channel = channel
        self.aud = aud
        self.iss = iss
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
    case otherAudience = "Token is for another audience"
    case otherIssuer = "Token is from another issuer"
}

/// What every token must also say when the broker is configured to check it.
public struct JWTExpectations: Sendable, Equatable {
    /// `aud` must contain it.
    public var audience: String?
    /// `iss` must equal it.
    public var issuer: String?

    public init(audience: String? = nil, issuer: String? = nil) {
        self.audience = audience
        self.issuer = issuer
    }
}

/// The JWT decision tables, pure: claims (already verified) × channel × time.
public enum JWTRules {
    /// The checks every token passes: `exp` (strictly in the future), `nbf`, and the configured `aud` and `iss`.
    public static func checkTime(_ claims: JWTClaims, now: Double, expecting: JWTExpectations = .init()) -> JWTRefusal?
    {
        if let exp = claims.exp, now >= exp { return .expired }
        if let nbf = claims.nbf, now < nbf { return .notYetValid }
        if let audience = expecting.audience, !(claims.aud?.values.contains(audience) ?? false) {
            return .otherAudience
        }
        if let issuer = expecting.issuer, claims.iss != issuer { return .otherIssuer }
        return nil
    }

    /// A connection token presented at the handshake: what the session is granted.
    public static func connection(_ claims: JWTClaims, now: Double, expecting: JWTExpectations = .init())
        -> Result<SessionGrant, JWTRefusal>
    {
        if let refusal = checkTime(claims, now: now, expecting: expecting) { return .failure(refusal) }
        guard let sub = claims.sub, !sub.isEmpty else { return .failure(.noSubject) }
        return .success(
            SessionGrant(
                user: sub, expiresAt: claims.exp, channels: claims.channels ?? [], publish: claims.publish ?? []))
    }

    /// A subscription token: its `sub` must be the session's user and its `channel` the subscription.
    public static func subscription(
        _ claims: JWTClaims, channel: String, sessionUser: String?, now: Double, expecting: JWTExpectations = .init()
    ) -> JWTRefusal? {
        if let refusal = checkTime(claims, now: now, expecting: expecting) { return refusal }
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
