import Testing

@testable import PubSubAuth
@testable import PubSubCore

/// Claims × channel × time, without signatures (those are `JWTAuthorizerTests`).
@Suite struct JWTRulesTests {
    static let now = 1_000_000.0

    @Test(arguments: [
        (JWTClaims(sub: "42", exp: now + 60), nil as JWTRefusal?),
        (JWTClaims(sub: "42"), nil),
        (JWTClaims(sub: "42", exp: now), .expired),  // exp is the first instant it is no longer valid
        (JWTClaims(sub: "42", exp: now - 1), .expired),
        (JWTClaims(sub: "42", nbf: now + 1), .notYetValid),
        (JWTClaims(sub: "42", nbf: now), nil),
        (JWTClaims(exp: now + 60), .noSubject),
        (JWTClaims(sub: "", exp: now + 60), .noSubject),
    ])
    func connectionToken(_ claims: JWTClaims, _ refusal: JWTRefusal?) {
        switch JWTRules.connection(claims, now: Self.now) {
        case .success(let grant):
            #expect(refusal == nil)
            #expect(grant.user == claims.sub && grant.expiresAt == claims.exp)
        case .failure(let got): #expect(got == refusal)
        }
    }

    static let grant = SessionGrant(
        user: "42", expiresAt: now + 60, channels: ["/jobs/42", "/users/42/**", "/rooms/*"], publish: ["/chat/**"])

    @Test(arguments: [
        ("/jobs/42", nil as JWTRefusal?),
        ("/jobs/43", .notGranted),
        ("/jobs/*", .notGranted),  // a pattern receives more than the one channel granted
        ("/users/42/inbox", nil),
        ("/users/42/a/b", nil),
        ("/users/42/**", nil),
        ("/users/43/inbox", .notGranted),
        ("/users/420", .notGranted),
        ("/rooms/lobby", nil),
        ("/rooms/lobby/x", .notGranted),
        ("/rooms/**", .notGranted),
    ])
    func subscriptionCoveredByTheConnectionToken(_ channel: String, _ refusal: JWTRefusal?) {
        #expect(JWTRules.subscribe(Self.grant, channel: channel, now: Self.now) == refusal)
    }

    @Test func grantStopsAtItsExpiryAndNoGrantGrantsNothing() {
        #expect(JWTRules.subscribe(Self.grant, channel: "/jobs/42", now: Self.now + 60) == .expired)
        #expect(JWTRules.publish(Self.grant, channel: "/chat/x", now: Self.now + 61) == .expired)
        #expect(JWTRules.subscribe(nil, channel: "/jobs/42", now: Self.now) == .notGranted)
        #expect(JWTRules.publish(nil, channel: "/chat/x", now: Self.now) == .notGranted)
    }

    @Test(arguments: [("/chat/room1", nil as JWTRefusal?), ("/chat/a/b", nil), ("/jobs/42", .notGranted)])
    func publishCoveredByThePublishClaim(_ channel: String, _ refusal: JWTRefusal?) {
        #expect(JWTRules.publish(Self.grant, channel: channel, now: Self.now) == refusal)
    }

    @Test(arguments: [
        (JWTClaims(sub: "42", exp: now + 60, channel: "/jobs/42"), "/jobs/42", "42" as String?, nil as JWTRefusal?),
        (JWTClaims(sub: "42", channel: "/jobs/42"), "/jobs/42", "42", nil),
        (JWTClaims(sub: "43", exp: now + 60, channel: "/jobs/42"), "/jobs/42", "42", .otherUser),
        (JWTClaims(sub: "42", exp: now + 60, channel: "/jobs/42"), "/jobs/42", nil, .otherUser),
        (JWTClaims(sub: "42", exp: now + 60, channel: "/jobs/42"), "/jobs/43", "42", .otherChannel),
        (JWTClaims(sub: "42", exp: now + 60, channel: "/jobs/*"), "/jobs/42", "42", .otherChannel),
        (JWTClaims(sub: "42", exp: now + 60), "/jobs/42", "42", .otherChannel),
        (JWTClaims(sub: "42", exp: now - 1, channel: "/jobs/42"), "/jobs/42", "42", .expired),
        (JWTClaims(sub: "42", nbf: now + 5, channel: "/jobs/42"), "/jobs/42", "42", .notYetValid),
        (JWTClaims(exp: now + 60, channel: "/jobs/42"), "/jobs/42", "42", .noSubject),
    ])
    func subscriptionToken(_ claims: JWTClaims, _ channel: String, _ user: String?, _ refusal: JWTRefusal?) {
        #expect(JWTRules.subscription(claims, channel: channel, sessionUser: user, now: Self.now) == refusal)
    }

    static let expecting = JWTExpectations(audience: "pubsub", issuer: "https://app.example.com")

    @Test(arguments: [
        (JWTClaims(sub: "42", aud: .init(["pubsub"]), iss: "https://app.example.com"), nil as JWTRefusal?),
        (JWTClaims(sub: "42", aud: .init(["web", "pubsub"]), iss: "https://app.example.com"), nil),
        (JWTClaims(sub: "42", aud: .init(["web"]), iss: "https://app.example.com"), .otherAudience),
        (JWTClaims(sub: "42", iss: "https://app.example.com"), .otherAudience),
        (JWTClaims(sub: "42", aud: .init(["pubsub"]), iss: "https://evil.example.com"), .otherIssuer),
        (JWTClaims(sub: "42", aud: .init(["pubsub"])), .otherIssuer),
    ])
    func audienceAndIssuerWhenConfigured(_ claims: JWTClaims, _ refusal: JWTRefusal?) {
        #expect(JWTRules.checkTime(claims, now: Self.now, expecting: Self.expecting) == refusal)
        #expect(JWTRules.checkTime(claims, now: Self.now) == nil)  // not configured: not checked
    }
}
