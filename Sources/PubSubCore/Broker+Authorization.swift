import Bayeux
import Logging
import NIOCore

/// The authorization stage: after the extensions' `incoming`, before the meta channel or publish is handled.
/// A refusal becomes the message's `error`, so the handler replies `successful: false` with it, exactly as when
/// an extension vetoes (a refused subscribe subscribes nothing, a refused publish delivers nothing).
extension Broker {
    /// `401:<clientId>:Token expired`: the connection token ran out; the client must handshake again.
    static let tokenExpired = BayeuxError.Code(401, "Token expired")

    func authorizeAndRoute(
        _ message: Message,
        context: RequestContext,
        sink: (any DeliverySink)?,
        now: NIODeadline,
        on loop: any EventLoop
    ) -> EventLoopFuture<Outcome> {
        let authorization = extensions.authorization
        let clientId = message.clientId
        @Sendable func route(_ message: Message, user: String? = nil) -> EventLoopFuture<Outcome> {
            self.route(message, context: context, sink: sink, user: user, now: now, on: loop).future(on: loop)
        }
        if message.error != nil { return route(message) }
        switch message.channel {
        case Channel.handshake?:
            guard !authorization.deciders(for: .handshake).isEmpty else { return route(message) }
            let request = AuthorizationRequest(
                action: .handshake, clientId: nil, channel: nil, message: message, context: context)
            return authorization.decideHandshake(request, on: loop).flatMap { verdict in
                switch verdict {
                case .refused(let text):
                    self.logRefusal(.handshake, channel: nil, clientId: nil, user: nil, text: text, context: context)
                    var refused = message
                    refused.error = text
                    return route(refused)
                case .accepted(let user, let grant):
                    return route(message, user: user).flatMap { outcome in
                        self.startSession(outcome, grant: grant, on: loop)
                    }
                }
            }

        case Channel.connect?:
            guard let clientId, authorization.usesGrants else { return route(message) }
            return sessionGrant(clientId, on: loop).flatMap { grant in
                guard let grant, let expiresAt = grant.expiresAt, authorization.wallClock() >= expiresAt else {
                    return route(message)
                }
                // The connection token has expired: the session ends, and the reply (401, advice handshake) makes
                // the client handshake again, with a fresh token.
                authorization.grants.remove(clientId)
                self.logger.debug(
                    "connection token expired",
                    metadata: ["pubsub.client.id": "\(clientId)", "pubsub.user": "\(grant.user)"])
                return self.engine.destroyClient(clientId, reason: .expired, on: loop).flatMap { _ in
                    var refused = message
                    refused.error = BayeuxError(Self.tokenExpired, clientId).description
                    return route(refused)
                }
            }

        case Channel.disconnect?:
            if let clientId { authorization.grants.remove(clientId) }
            return route(message)

        case Channel.subscribe?:
            guard !authorization.deciders(for: .subscribe).isEmpty else { return route(message) }
            // As when PrivatePub was an extension, authorization comes before validation: a subscribe with no
            // usable subscription is asked about "" (and refused), not answered "missing parameter".
            var channels: [String]
            switch message["subscription"] {
            case .string(let s)?: channels = [s]
            case .array(let a)?: channels = a.compactMap(\.stringValue)
            default: channels = []
            }
            if channels.isEmpty { channels = [""] }
            return decide(.subscribe, message, clientId: clientId, channels: channels, context: context, on: loop)
                .flatMap { refusal in
                    var decided = message
                    if let refusal { decided.error = refusal }
                    return route(decided)
                }

        case let name? where !Channel.isMeta(name):
            // The server's own publishes (`serve --relay`) come from its configuration, not from a client: no mode
            // is asked (a relay beside a JWT-only broker has no PrivatePub token to show).
            if authorization.deciders(for: .publish).isEmpty || context.connectionType == .inProcess {
                var scrubbed = message
                authorization.scrub(&scrubbed)
                return route(scrubbed)
            }
            return decide(.publish, message, clientId: clientId, channels: [name], context: context, on: loop)
                .flatMap { refusal in
                    var decided = message
                    if let refusal { decided.error = refusal }
                    authorization.scrub(&decided)
                    return route(decided)
                }

        default:
            return route(message)
        }
    }

    /// Asks the modes about a subscribe or publish; returns the refusal's text, or nil when accepted.
    private func decide(
        _ action: AuthorizationAction,
        _ message: Message,
        clientId: String?,
        channels: [String],
        context: RequestContext,
        on loop: any EventLoop
    ) -> EventLoopFuture<String?> {
        let authorization = extensions.authorization
        let grant: EventLoopFuture<SessionGrant?> =
            clientId.map { sessionGrant($0, on: loop) } ?? loop.makeSucceededFuture(nil)
        return grant.flatMap { grant -> EventLoopFuture<(SessionGrant?, String?)> in
            if let grant { return loop.makeSucceededFuture((grant, grant.user)) }
            guard let clientId, authorization.needsUser(for: action) else {
                return loop.makeSucceededFuture((nil, nil))
            }
            return self.engine.user(of: clientId, on: loop).recover { _ in nil }.map { (nil, $0) }
        }.flatMap { grant, user in
            let request = AuthorizationRequest(
                action: action, clientId: clientId, channel: nil, message: message, user: user, grant: grant,
                context: context)
            return authorization.decide(request, channels: channels, on: loop).map { verdict in
                guard case .refused(let text) = verdict else { return nil }
                self.logRefusal(
                    action, channel: channels.first, clientId: clientId, user: user, text: text, context: context)
                return text
            }
        }
    }

    /// After a successful handshake (whose session was created with its user): the grant goes to the engine and
    /// to this node's table.
    private func startSession(_ outcome: Outcome, grant: SessionGrant?, on loop: any EventLoop)
        -> EventLoopFuture<Outcome>
    {
        guard case .reply(let reply) = outcome, reply["successful"] == .bool(true), let clientId = reply.clientId
        else { return loop.makeSucceededFuture(outcome) }
        let authorization = extensions.authorization
        if authorization.usesGrants, let ids = authorization.grants.insert(grant, for: clientId) {
            pruneGrants(ids, on: loop)
        }
        let stored =
            grant.map { engine.setGrant(clientId, grant: $0.encoded, on: loop) } ?? loop.makeSucceededVoidFuture()
        return stored.map { outcome }.recover { _ in outcome }
    }

    /// The session's grant: this node's copy, else the engine's (read once per session and node).
    private func sessionGrant(_ clientId: String, on loop: any EventLoop) -> EventLoopFuture<SessionGrant?> {
        let authorization = extensions.authorization
        if let known = authorization.grants.lookup(clientId) { return loop.makeSucceededFuture(known) }
        guard authorization.usesGrants else { return loop.makeSucceededFuture(nil) }
        return engine.grant(of: clientId, on: loop).map { text in
            let grant = text.flatMap(SessionGrant.init(encoded:))
            if let ids = authorization.grants.insert(grant, for: clientId) { self.pruneGrants(ids, on: loop) }
            return grant
        }.recover { _ in nil }
    }

    /// Drops the grants of sessions that ended without a disconnect (expired, overflowed).
    private func pruneGrants(_ ids: [String], on loop: any EventLoop) {
        let grants = extensions.authorization.grants
        let checks = ids.map { id in engine.clientExists(id, on: loop).map { exists in (id, exists) } }
        EventLoopFuture.whenAllComplete(checks, on: loop).whenSuccess { results in
            for case .success((let id, false)) in results { grants.remove(id) }
            grants.pruned()
        }
    }

    private func logRefusal(
        _ action: AuthorizationAction, channel: String?, clientId: String?, user: String?, text: String,
        context: RequestContext
    ) {
        var metadata: Logger.Metadata = ["pubsub.auth.action": "\(action.rawValue)", "pubsub.error": "\(text)"]
        if let channel { metadata["pubsub.channel"] = "\(channel)" }
        if let clientId { metadata["pubsub.client.id"] = "\(clientId)" }
        if let user { metadata["pubsub.user"] = "\(user)" }
        if let address = context.remoteAddress { metadata["pubsub.remote"] = "\(address)" }
        logger.debug("refused", metadata: metadata)
    }
}
