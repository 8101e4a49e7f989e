/// How the answers of several modes combine: the decision table of "modes combined", kept pure for tests.
public enum AuthorizationVerdict: Sendable, Equatable {
    case accepted(user: String?, grant: SessionGrant?)
    case refused(String)

    /// A subscribe or publish: accepted when any mode accepts (the first that did names the user). Otherwise
    /// refused with the first outright refusal's text, else the first abstention's: a client that presented a
    /// token hears what was wrong with it, not that it lacks a signature.
    public static func any(_ decisions: [AuthorizationDecision]) -> AuthorizationVerdict {
        var firstDeny: String?
        var firstAbstain: String?
        for decision in decisions {
            switch decision {
            case .allow(let user, let grant): return .accepted(user: user, grant: grant)
            case .deny(let text): if firstDeny == nil { firstDeny = text }
            case .abstain(let text): if firstAbstain == nil { firstAbstain = text }
            }
        }
        if decisions.isEmpty { return .accepted(user: nil, grant: nil) }
        return .refused(firstDeny ?? firstAbstain!)
    }

    /// A handshake: refused when any mode refuses outright (an invalid token, the hook saying no); a mode with
    /// nothing to go on does not refuse (a PrivatePub client handshakes without a token). The first mode that
    /// names a user names the session's user; the first grant is kept.
    public static func handshake(_ decisions: [AuthorizationDecision]) -> AuthorizationVerdict {
        var user: String?
        var grant: SessionGrant?
        for decision in decisions {
            switch decision {
            case .allow(let u, let g):
                if user == nil { user = u ?? g?.user }
                if grant == nil { grant = g }
            case .deny(let text): return .refused(text)
            case .abstain: break
            }
        }
        return .accepted(user: user, grant: grant)
    }
}
