import Bayeux
import Logging
import NIOCore

extension Broker {
    func handshake(_ message: Message, user: String? = nil, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<Outcome>
    {
        var reply = message.makeResponse()
        reply["version"] = "1.0"
        reply["supportedConnectionTypes"] = ConnectionType.advertised
        var error: BayeuxError?
        if message["version"] == nil || message["version"]?.isNull == true {
            error = .parameterMissing("version")
        }
        if let types = message["supportedConnectionTypes"]?.arrayValue {
            let known = Set(ConnectionType.allCases.map(\.rawValue))
            if !types.contains(where: { $0.stringValue.map(known.contains) ?? false }) {
                error = .connectionTypeMismatch(types.map { $0.stringValue ?? $0.jsonString })
            }
        } else {
            error = .parameterMissing("supportedConnectionTypes")
        }
        if message.error != nil || error != nil {
            // A handshake echoes whatever clientId it was sent (as Faye does).
            reply.mustHandshake(error, keepingClientId: true)
            return loop.makeSucceededFuture(.reply(reply))
        }
        return engine.createClient(now: now, user: user, on: loop).map { [reply] clientId in
            var reply = reply
            reply.clientId = clientId
            reply["advice"] = self.retryAdvice
            var ext = JSONObject()
            if let position = self.engine.position { ext["position"] = .string(position) }
            // CometD's acknowledgement extension: every connect reply names its batch (`closeBatch`).
            if message.ext?["ack"] == .bool(true) { ext["ack"] = .bool(true) }
            if !ext.isEmpty { reply.ext = ext }
            return .reply(reply)
        }
    }

    func connect(
        _ message: Message,
        context: RequestContext,
        sink: (any DeliverySink)?,
        now: NIODeadline,
        on loop: any EventLoop
    ) -> Eventual<Outcome> {
        var reply = message.makeResponse()
        func failed(_ error: BayeuxError?) -> Eventual<Outcome> {
            reply.mustHandshake(error)
            return .value(.reply(reply))
        }
        if message.error != nil { return failed(nil) }
        let request: ConnectRequest
        switch ConnectRequest.validate(message) {
        case .success(let valid): request = valid
        case .failure(let error): return failed(error)
        }
        let (clientId, connectionType) = (request.clientId, request.connectionType)
        var hold = configuration.timeout
        if let requested = message["advice"]?.objectValue?["timeout"]?.doubleValue, requested >= 0 {
            hold = min(hold, .nanoseconds(Int64(requested * 1_000_000)))
        }
        let isEventSource = connectionType == .eventSource
        if isEventSource {
            hold = .zero
            reply["advice"] = Advice.retry(
                intervalMilliseconds: configuration.timeoutMilliseconds, timeoutMilliseconds: 0)
        } else {
            reply["advice"] = retryAdvice
        }
        let offered: (any DeliverySink)? = (hold == .zero && sink?.isPersistent != true) ? nil : sink
        // What the connect proves the client read: its id, and the batch it acknowledges (CometD's extension).
        let ack = message.ext?["ack"]?.doubleValue.flatMap { $0 >= 0 && $0 < 9.0e15 ? UInt64($0) : nil }
        let receipt = ConnectReceipt(connectId: message.id, ack: ack)
        let (template, held) = (reply, hold)
        // What the engine's answer becomes: applied at once to the memory engine's (no closure kept), or later.
        @Sendable func outcome(_ result: ConnectResult) -> Outcome {
            var reply = template
            switch result.status {
            case .unknownClient:
                reply.mustHandshake(.clientUnknown(clientId))
                return .reply(reply)
            case .kicked:
                reply.mustNotReconnect(clientId)
                return .reply(reply)
            case .overflowed:
                // A polling client dropped by the engine between two polls (its queue filled before it came back)
                // is seen here first; a client dropped by its connection was logged then ("slow consumer dropped").
                self.logger.info(
                    "dropped client told to handshake again",
                    metadata: [
                        "pubsub.client.id": "\(clientId)", "pubsub.transport": "\(context.connectionType.rawValue)",
                    ])
                reply.mustHandshake(BayeuxError(.queueOverflow, clientId))
                return .reply(reply)
            case .ok:
                self.queries?.noteConnection(clientId, type: isEventSource ? .eventSource : context.connectionType)
                var result = result
                if held == .zero { result.answerNow = true }
                return .connect(
                    PendingConnect(
                        id: message.id, clientId: result.clientId ?? clientId, advice: reply["advice"], result: result,
                        hold: held, acknowledges: ack != nil))
            }
        }
        switch engine.connecting(clientId, now: now, sink: isEventSource ? nil : offered, receipt: receipt, on: loop) {
        case .now(let result): return .now(result.map(outcome))
        case .later(let future): return .later(future.map(outcome))
        }
    }

    func subscribe(_ message: Message, subscribing: Bool, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<Outcome>
    {
        var reply = message.makeResponse()
        reply["subscription"] = message["subscription"] ?? .array([])
        if message.error != nil { return loop.makeSucceededFuture(.reply(reply)) }
        let request: SubscribeRequest
        switch SubscribeRequest.validate(message) {
        case .success(let valid): request = valid
        case .failure(let error):
            reply.fail(error)
            return loop.makeSucceededFuture(.reply(reply))
        }
        let clientId = request.clientId
        // Channels up to the first invalid one are applied; the error names that one.
        var channels: [String] = []
        var channelError: BayeuxError?
        for value in request.channels {
            guard let name = value.stringValue else {
                channelError = .channelInvalid(value.jsonString)
                break
            }
            if name.utf8.count > configuration.maxChannelLength {
                channelError = BayeuxError(.channelTooLong)
                break
            }
            if !Channel.isValidNameOrPattern(name) {
                channelError = .channelInvalid(name)
                break
            }
            if Channel.isMeta(name) || Channel.isService(name) {
                channelError = .channelForbidden(name)
                break
            }
            channels.append(name)
        }
        // A resume token that is not a string is as good as a garbage one: answered, never an error.
        let resume = message.ext?["resume"].map { $0.stringValue ?? "" }
        let future =
            subscribing
            ? engine.subscribe(clientId, to: channels, resume: resume, now: now, on: loop)
            : engine.unsubscribe(clientId, from: channels, on: loop).map { ($0, nil) }
        return future.map { [reply, channelError] result, resumed in
            var reply = reply
            if let resumed {
                reply.ext = [
                    "resume": .object(["recovered": .bool(resumed.recovered), "missed": JSONValue(resumed.missed)])
                ]
            }
            switch result {
            case .unknownClient: reply.fail(.clientUnknown(clientId))
            case .overflowed:
                reply.mustHandshake(BayeuxError(.queueOverflow, clientId), keepingClientId: true)
            case .limitReached(let channel): reply.fail(BayeuxError(.subscriptionLimit, channel))
            case .ok: if let channelError { reply.fail(channelError) }
            }
            return .reply(reply)
        }
    }

    func disconnect(_ message: Message, on loop: any EventLoop) -> EventLoopFuture<Outcome> {
        var reply = message.makeResponse()
        if message.error != nil {
            reply.clientId = nil
            return loop.makeSucceededFuture(.reply(reply))
        }
        guard let clientId = message.clientId else {
            reply.fail(.parameterMissing("clientId"))
            reply.clientId = nil
            return loop.makeSucceededFuture(.reply(reply))
        }
        return engine.destroyClient(clientId, reason: .disconnected, on: loop).map { [reply] existed in
            var reply = reply
            if !existed {
                reply.fail(.clientUnknown(clientId))
                reply.clientId = nil
            }
            return .reply(reply)
        }
    }

    /// A publish; answered at once when the engine does not wait (`Engine.publishing`).
    func publish(_ message: Message, now: NIODeadline, on loop: any EventLoop) -> Eventual<Outcome> {
        var reply = message.makeResponse()
        if message.error != nil { return .value(.reply(reply)) }
        let channel: String
        switch PublishRequest.validate(message, maxChannelLength: configuration.maxChannelLength) {
        case .success(let valid): channel = valid.channel
        case .failure(let error):
            reply.fail(error)
            return .value(.reply(reply))
        }
        var event = message
        event.clientId = nil
        guard let delivered = extensions.outgoingEvent(event) else { return .value(.reply(reply)) }
        return engine.publishing(delivered, to: channel, now: now, on: loop).map { [reply] _ in .reply(reply) }
            .flatMapErrorThrowing { [reply] error in
                // Refused: nothing was delivered, publish again. Uncertain: maybe delivered; the client decides.
                let code: BayeuxError.Code
                switch error {
                case is PublishRefused: code = .publishFailed
                case is PublishUncertain: code = .publishUncertain
                default: throw error
                }
                var failed = reply
                failed.fail(BayeuxError(code, channel))
                return .reply(failed)
            }
    }
}

/// A `/meta/connect` whose required fields validation proved present.
struct ConnectRequest {
    let clientId: String
    let connectionType: ConnectionType

    /// Checks the fields; when several are wrong, the error names the last one checked (as it always has).
    static func validate(_ message: Message) -> Result<ConnectRequest, BayeuxError> {
        var error: BayeuxError?
        if message.clientId == nil { error = .parameterMissing("clientId") }
        var connectionType: ConnectionType?
        if let typeValue = message["connectionType"] {
            let name = typeValue.stringValue ?? typeValue.jsonString
            connectionType = ConnectionType(rawValue: name)
            if connectionType == nil { error = .connectionTypeMismatch([name]) }
        } else {
            error = .parameterMissing("connectionType")
        }
        guard let clientId = message.clientId, let connectionType else {
            return .failure(error ?? .parameterMissing("connectionType"))
        }
        return .success(ConnectRequest(clientId: clientId, connectionType: connectionType))
    }
}

/// A `/meta/subscribe` or `/meta/unsubscribe` whose client and subscription validation proved present (each
/// channel named in it is still checked, one by one: those before the first bad one are applied).
struct SubscribeRequest {
    let clientId: String
    let channels: [JSONValue]

    static func validate(_ message: Message) -> Result<SubscribeRequest, BayeuxError> {
        let channels: [JSONValue]?
        switch message["subscription"] {
        case .string(let s)?: channels = [.string(s)]
        case .array(let a)?: channels = a
        default: channels = nil
        }
        guard let channels else { return .failure(.parameterMissing("subscription")) }
        guard let clientId = message.clientId else { return .failure(.parameterMissing("clientId")) }
        return .success(SubscribeRequest(clientId: clientId, channels: channels))
    }
}

/// A publish whose channel and data validation proved usable.
struct PublishRequest {
    let channel: String

    /// A missing `data` wins over a bad channel (as it always has).
    static func validate(_ message: Message, maxChannelLength: Int) -> Result<PublishRequest, BayeuxError> {
        if message.data == nil || message.data?.isNull == true { return .failure(.parameterMissing("data")) }
        guard let channel = message.channel else { return .failure(.channelInvalid("")) }
        if channel.utf8.count > maxChannelLength { return .failure(BayeuxError(.channelTooLong)) }
        if !Channel.isValidName(channel) { return .failure(.channelInvalid(channel)) }
        return .success(PublishRequest(channel: channel))
    }
}

extension Message {
    /// Makes this reply say that the session is gone and the client must handshake again: it fails with
    /// `error` (when given), loses its `clientId` (unless kept, as a subscribe reply keeps it), and carries
    /// `advice: {reconnect: "handshake"}`. Every such reply, of the broker and of the transports, is made here.
    public mutating func mustHandshake(_ error: BayeuxError?, keepingClientId: Bool = false) {
        if let error { fail(error) }
        if !keepingClientId { clientId = nil }
        self["advice"] = Advice.handshake
    }

    /// Adds `ext.position` (creating `ext` when absent; an `ext` that is not an object is left alone).
    mutating func setPosition(_ token: String) {
        switch fields["ext"] {
        case nil, .null?: fields["ext"] = .object(["position": .string(token)])
        case .object(var ext)?:
            ext["position"] = .string(token)
            fields["ext"] = .object(ext)
        default: break
        }
    }
}
