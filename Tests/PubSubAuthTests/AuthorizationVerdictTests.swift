import Testing

@testable import PubSubCore

/// Modes combined: the decision table of `AuthorizationVerdict`.
@Suite struct AuthorizationVerdictTests {
    static let grant = SessionGrant(user: "42", expiresAt: 100, channels: ["/jobs/42"])

    @Test(
        arguments: [
            // Any allow accepts, whatever came before it; the first allow names the user.
            ([.deny("bad"), .allow(user: "7")], AuthorizationVerdict.accepted(user: "7", grant: nil)),
            ([.abstain("no sig"), .abstain("no token"), .allow()], .accepted(user: nil, grant: nil)),
            ([.allow(user: "1"), .allow(user: "2")], .accepted(user: "1", grant: nil)),
            // None accepts: the first outright refusal wins over abstentions, whatever the order.
            ([.abstain("Incorrect signature."), .deny("403:/a:Token expired")], .refused("403:/a:Token expired")),
            ([.deny("first"), .deny("second")], .refused("first")),
            // Only abstentions: the first one's text (PrivatePub's, so a --secret broker answers as before).
            (
                [.abstain("Incorrect signature."), .abstain("403:/a:No token grants this channel")],
                .refused("Incorrect signature.")
            ),
            // No mode decides this action: not checked.
            ([], .accepted(user: nil, grant: nil)),
        ] as [([AuthorizationDecision], AuthorizationVerdict)])
    func subscribeOrPublishIsAcceptedWhenAnyModeAccepts(
        _ decisions: [AuthorizationDecision], _ expected: AuthorizationVerdict
    ) {
        #expect(AuthorizationVerdict.any(decisions) == expected)
    }

    @Test(
        arguments: [
            // A handshake is refused by any outright refusal, even after an acceptance.
            (
                [.allow(user: "42", grant: grant), .deny("403::Not today")],
                AuthorizationVerdict.refused("403::Not today")
            ),
            ([.deny("401::Invalid token"), .allow(user: "9")], .refused("401::Invalid token")),
            // Abstentions do not refuse: a client without a token still handshakes.
            ([.abstain("401::Invalid token")], .accepted(user: nil, grant: nil)),
            ([], .accepted(user: nil, grant: nil)),
            // The first user named wins (the JWT's sub before the hook's answer); the grant names its user.
            ([.allow(user: nil, grant: grant), .allow(user: "hook-user")], .accepted(user: "42", grant: grant)),
            ([.abstain("x"), .allow(user: "hook-user")], .accepted(user: "hook-user", grant: nil)),
        ] as [([AuthorizationDecision], AuthorizationVerdict)])
    func handshakeIsRefusedByAnyRefusal(_ decisions: [AuthorizationDecision], _ expected: AuthorizationVerdict) {
        #expect(AuthorizationVerdict.handshake(decisions) == expected)
    }
}
