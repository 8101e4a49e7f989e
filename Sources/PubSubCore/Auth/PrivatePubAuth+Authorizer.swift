import Bayeux
import NIOCore

/// PrivatePub's signatures (or HMAC-SHA256 ones) and publish token as one mode of an `AuthorizationPipeline`.
/// Its answers are the extension's: the same checks and the same error texts ("Incorrect signature.").
extension PrivatePubAuth: Authorizer {
    public var name: String { "privatepub" }
    public var actions: Set<AuthorizationAction> { [.subscribe, .publish] }

    public func authorize(_ request: AuthorizationRequest, on loop: any EventLoop)
        -> EventLoopFuture<AuthorizationDecision>
    {
        loop.makeSucceededFuture(decide(request))
    }

    func decide(_ request: AuthorizationRequest) -> AuthorizationDecision {
        let ext = request.message.ext
        switch request.action {
        case .handshake:
            return .allow()
        case .subscribe:
            if let channel = request.channel, publicChannels.contains(where: { Self.pattern($0, covers: channel) }) {
                return .allow()
            }
            guard let error = checkSubscription(request.message) else { return .allow() }
            let presented = ext?["private_pub_signature"] != nil || ext?["signature"] != nil
            return presented ? .deny(error) : .abstain(error)
        case .publish:
            guard let token = ext?["private_pub_token"] else { return .abstain(Self.incorrectToken) }
            guard let text = token.stringValue, constantTimeEqual(text, secret) else {
                return .deny(Self.incorrectToken)
            }
            return .allow()
        }
    }

    public func scrub(_ message: inout Message) {
        guard var ext = message.ext, ext["private_pub_token"] != nil else { return }
        ext["private_pub_token"] = .null
        message.ext = ext
    }
}

/// Channels anyone may subscribe to (`--public`), as a mode: it accepts a subscription when every channel it
/// can receive is matched by a public pattern, and has nothing to say about anything else.
public struct PublicChannels: Authorizer {
    public var patterns: [String]
    public var name: String { "public" }
    public var actions: Set<AuthorizationAction> { [.subscribe] }

    public init(_ patterns: [String]) { self.patterns = patterns }

    public func authorize(_ request: AuthorizationRequest, on loop: any EventLoop)
        -> EventLoopFuture<AuthorizationDecision>
    {
        loop.makeSucceededFuture(decide(request.channel ?? ""))
    }

    public func decide(_ channel: String) -> AuthorizationDecision {
        patterns.contains { PrivatePubAuth.pattern($0, covers: channel) }
            ? .allow() : .abstain(BayeuxError.channelForbidden(channel).description)
    }
}
