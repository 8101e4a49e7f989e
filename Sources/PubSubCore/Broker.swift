import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore

/// What handling one message produced.
public enum Outcome: Sendable {
    /// A reply to send (it has been through the outgoing extensions).
    case reply(Message)
    /// A successful `/meta/connect`: the transport sends `events`, and the reply now or when the hold ends.
    case connect(PendingConnect)
    /// An incoming extension swallowed the message: no reply.
    case none
}

/// A successful connect whose reply may be held.
public struct PendingConnect: Sendable {
    /// The connect's `id`, echoed in the reply.
    public var id: JSONValue?
    public var clientId: String
    /// The reply's advice (one shared value).
    public var advice: JSONValue?
    public var result: ConnectResult
    /// How long it may be held (the server timeout, or less when the client asked).
    public var hold: TimeAmount
    /// The client speaks CometD's acknowledgement extension (its connect carried `ext.ack`): the reply names
    /// its batch (`Broker.closeBatch`).
    public var acknowledges: Bool

    public init(
        id: JSONValue?, clientId: String, advice: JSONValue?, result: ConnectResult, hold: TimeAmount,
        acknowledges: Bool = false
    ) {
        self.id = id
        self.clientId = clientId
        self.advice = advice
        self.result = result
        self.hold = hold
        self.acknowledges = acknowledges
    }

    /// The reply, before outgoing extensions (`Broker.finish` applies them when it is sent): Faye's response to
    /// a successful connect, built when it is sent. A held connect keeps its `id` and a reference to the shared
    /// advice, not a reply object of its own, for as long as the connection idles.
    public var reply: Message {
        var fields = JSONObject()
        fields.reserveCapacity(5)
        if let id { fields["id"] = id }
        fields["clientId"] = .string(clientId)
        fields["channel"] = .string(Channel.connect)
        fields["successful"] = .bool(true)
        if let advice { fields["advice"] = advice }
        return Message(fields)
    }
}

/// The Bayeux server logic: meta channels and publishing, in Faye's validation order, over an `Engine`.
/// Transport-agnostic: transports parse requests, call `handle`, and perform what comes back.
public final class Broker: Sendable {
    public let configuration: BrokerConfiguration
    public let engine: any Engine
    /// The engine as it answers the server API's questions (nil when it does not): looked up once, here, since
    /// every connect tells it the connection type (`noteConnection`).
    let queries: (any EngineQueries)?
    public let extensions: ExtensionPipeline
    let logger: Logger
    /// The advice of handshake and connect replies, built once: every held connect keeps its reply, and one
    /// shared value is a reference where a copy per connection was a dictionary of its own.
    let retryAdvice: JSONValue

    public init(
        configuration: BrokerConfiguration = .init(),
        engine: (any Engine)? = nil,
        extensions: ExtensionPipeline = .init(),
        logger: Logger = Logger(label: "pubsub.broker")
    ) {
        self.configuration = configuration
        let engine = engine ?? MemoryEngine(configuration: configuration, logger: logger)
        self.engine = engine
        self.queries = engine as? any EngineQueries
        self.extensions = extensions
        self.logger = logger
        self.retryAdvice = Advice.retry(
            intervalMilliseconds: configuration.intervalMilliseconds,
            timeoutMilliseconds: configuration.timeoutMilliseconds)
    }

    /// Handles the messages of one request or frame, in order. `sink` is offered to the first `/meta/connect`
    /// (a one-shot sink is only used when the connect is the sole message, so other replies are never held).
    ///
    /// A request of more than `maxMessagesPerRequest` elements is refused whole: none of it is handled and it
    /// gets one reply, `413:<limit>:Too many messages in one request`. Answering each element past the limit
    /// (as before) turned a 1 MB body of 500,000 `1`s into 24 MB of replies. So the replies of one request are
    /// at most `maxMessagesPerRequest`, each the size of what its message echoes (`id`, `channel`,
    /// `subscription`, all within the request's own bytes) plus a bounded constant.
    public func handle(
        _ elements: [MessageBatch.Element],
        context: RequestContext,
        sink: (any DeliverySink)?,
        now: NIODeadline,
        on loop: any EventLoop
    ) -> EventLoopFuture<[Outcome]> {
        answer(elements, context: context, sink: sink, now: now, on: loop).future(on: loop)
    }

    /// `handle`, with the outcomes at once when nothing had to wait (a publish to the memory engine), so a
    /// transport performs them without a chain of futures.
    public func answer(
        _ elements: [MessageBatch.Element],
        context: RequestContext,
        sink: (any DeliverySink)?,
        now: NIODeadline,
        on loop: any EventLoop
    ) -> Eventual<[Outcome]> {
        if elements.count > configuration.maxMessagesPerRequest {
            let outcome = finish(tooManyMessagesReply, context: context).map(Outcome.reply) ?? .none
            return .value([outcome])
        }
        // One message (every poll, most publishes): its answer alone, without a chain.
        if elements.count == 1, case .message(let message) = elements[0] {
            let isConnect = message.channel == Channel.connect
            switch handleOne(message, context: context, sink: isConnect ? sink : nil, now: now, on: loop) {
            case .now(let result): return .now(result.map { [$0] })
            case .later(let future): return .later(future.map { [$0] })
            }
        }
        // Publishes only: each goes to the engine now, in order, and the answers are gathered as they come.
        if dispatchesAtOnce(elements) {
            var answers: [Eventual<Outcome>] = []
            answers.reserveCapacity(elements.count)
            for element in elements {
                switch element {
                case .invalid: answers.append(.value(.reply(Self.invalidElementReply)))
                case .message(let message):
                    answers.append(handleOne(message, context: context, sink: nil, now: now, on: loop))
                }
            }
            return Eventual.all(answers, on: loop)
        }
        // Filled in order, by one chain of futures on `loop`: each message waits for the answer before it.
        let outcomes = NIOLockedValueBox<[Outcome]>([])
        var offer = sink
        if let s = sink, !s.isPersistent, elements.count != 1 { offer = nil }
        var future = loop.makeSucceededFuture(())
        for element in elements {
            switch element {
            case .invalid:
                future = future.map { outcomes.withLockedValue { $0.append(.reply(Self.invalidElementReply)) } }
            case .message(let message):
                let isConnect = message.channel == Channel.connect
                let sinkForThis = isConnect ? offer : nil
                if isConnect { offer = nil }
                future = future.flatMap {
                    self.handleOne(message, context: context, sink: sinkForThis, now: now, on: loop).future(on: loop)
                        .map { outcome in outcomes.withLockedValue { $0.append(outcome) } }
                }
            }
        }
        return .later(future.map { outcomes.withLockedValue { $0 } })
    }

    /// Whether `answer` hands every message of `elements` to the engine before it returns: publishes only (no
    /// meta message, whose effect a later message may depend on), and no authorization stage (which may answer
    /// later). A connection may then take its next frame at once: the engine is given those messages after these,
    /// and keeps the order it is given them in (one Redis connection), whatever its latency.
    public func dispatchesAtOnce(_ elements: [MessageBatch.Element]) -> Bool {
        guard extensions.authorization.isEmpty, elements.count <= configuration.maxMessagesPerRequest else {
            return false
        }
        for case .message(let message) in elements {
            if let channel = message.channel, Channel.isMeta(channel) { return false }
        }
        return true
    }

    /// The one reply to a request over `maxMessagesPerRequest`: no `id` or `channel`, as it answers no single
    /// message; the limit is its argument, so a client knows how to split.
    var tooManyMessagesReply: Message {
        var reply = Message()
        reply.fail(BayeuxError(.tooManyMessages, String(configuration.maxMessagesPerRequest)))
        return reply
    }

    static let invalidElementReply: Message = {
        var reply = Message()
        reply.fail(BayeuxError.badRequest)
        return reply
    }()

    /// Applies the outgoing extensions to a reply about to be sent.
    public func finish(_ reply: Message, context: RequestContext) -> Message? {
        extensions.outgoing(reply, context: context)
    }

    /// The reply of a successful connect is being written, after everything its connection was handed so far:
    /// that closes the session's batch (`DeliveryLedger`), which the client's next connect confirms; a client of
    /// CometD's acknowledgement extension finds the batch's number in the reply's `ext.ack`.
    public func closeBatch(_ reply: inout Message, for connect: PendingConnect) {
        guard let batch = engine.closeBatch(connect.clientId, connectId: connect.id), connect.acknowledges else {
            return
        }
        var ext = reply.ext ?? [:]
        ext["ack"] = JSONValue(Int(batch))
        reply.ext = ext
    }

    func handleOne(
        _ original: Message,
        context: RequestContext,
        sink: (any DeliverySink)?,
        now: NIODeadline,
        on loop: any EventLoop
    ) -> Eventual<Outcome> {
        guard let message = extensions.incoming(original, context: context) else { return .value(.none) }
        if extensions.authorization.isEmpty {
            return route(message, context: context, sink: sink, now: now, on: loop)
        }
        return .later(authorizeAndRoute(message, context: context, sink: sink, now: now, on: loop))
    }

    /// Hands an incoming message to the meta channel or publish it names, and applies the outgoing extensions.
    /// `user`: who the authorization stage found a handshake to be (the new session's user).
    func route(
        _ message: Message,
        context: RequestContext,
        sink: (any DeliverySink)?,
        user: String? = nil,
        now: NIODeadline,
        on loop: any EventLoop
    ) -> Eventual<Outcome> {
        let channel = message.channel
        let answer: Eventual<Outcome>
        switch channel {
        case Channel.handshake?: answer = .later(handshake(message, user: user, now: now, on: loop))
        case Channel.connect?: answer = connect(message, context: context, sink: sink, now: now, on: loop)
        case Channel.subscribe?: answer = .later(subscribe(message, subscribing: true, now: now, on: loop))
        case Channel.unsubscribe?: answer = .later(subscribe(message, subscribing: false, now: now, on: loop))
        case Channel.disconnect?: answer = .later(disconnect(message, on: loop))
        case let name? where Channel.isMeta(name):
            var reply = message.makeResponse()
            if message.error == nil { reply.fail(.channelForbidden(name)) }
            answer = .value(.reply(reply))
        default:
            answer = publish(message, now: now, on: loop)
        }
        switch answer {
        case .now(let result): return .now(result.map { finish($0, context: context) })
        case .later(let future): return .later(future.map { self.finish($0, context: context) })
        }
    }

    /// An outcome with the outgoing extensions applied to its reply.
    private func finish(_ outcome: Outcome, context: RequestContext) -> Outcome {
        if case .reply(let reply) = outcome { return finish(reply, context: context).map(Outcome.reply) ?? .none }
        return outcome
    }
}
