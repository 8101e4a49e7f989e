import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Prometheus
import Testing

@testable import PubSubCore
@testable import PubSubServer

/// An engine whose publishes and subscribes wait until the test answers them, as a Redis engine's wait for a
/// round trip: it records what it was handed, in order.
final class HeldAnswersEngine: DataPathOnlyEngine, @unchecked Sendable {
    let handed = NIOLockedValueBox<[String]>([])
    let publishes = NIOLockedValueBox<[EventLoopPromise<String?>]>([])

    override func publish(_ event: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<String?>
    {
        let promise = loop.makePromise(of: String?.self)
        handed.withLockedValue { $0.append("publish \(event["data"]?.jsonString ?? "-")") }
        publishes.withLockedValue { $0.append(promise) }
        return promise.futureResult
    }

    override func subscribe(
        _ clientId: String, to channels: [String], resume: String?, now: NIODeadline, on loop: any EventLoop
    ) -> EventLoopFuture<(SubscriptionResult, ResumeResult?)> {
        handed.withLockedValue { $0.append("subscribe \(channels.joined(separator: ","))") }
        return super.subscribe(clientId, to: channels, resume: resume, now: now, on: loop)
    }

    /// Answers the publishes handed so far, in order.
    func answerPublishes() {
        for promise in publishes.withLockedValue({ p in
            defer { p = [] }
            return p
        }) { promise.succeed(nil) }
    }
}

/// A publisher that keeps several publishes in flight is not held to one engine round trip each, and its
/// messages still reach the engine in the order it sent them (`FramesInFlight`, `Broker.dispatchesAtOnce`).
@Suite struct PipelinedFramesTests {
    static func publish(_ n: Int, _ clientId: String) -> String {
        #"{"channel":"/p","clientId":"\#(clientId)","data":\#(n),"id":"p\#(n)"}"#
    }

    /// The ids of the replies written so far, in order.
    static func replyIds(_ channel: EmbeddedChannel) throws -> [String] {
        try ConnectionHandlerTests.frames(channel).flatMap { frame in
            (frame.arrayValue ?? []).compactMap { $0.objectValue?["id"]?.stringValue }
        }
    }

    /// A WebSocket on a broker over `engine`, handshaken; its client id.
    static func webSocket(_ engine: HeldAnswersEngine) throws -> (EmbeddedChannel, String) {
        let recorder = ConnectionHandlerTests.LogRecorder()
        let configuration = ServerConfiguration(broker: BrokerConfiguration(maxQueue: 100, historySize: 0))
        let operations = ServerOperations(
            configuration: configuration.operations, loops: [], registry: PrometheusCollectorRegistry(),
            logger: recorder.logger)
        let broker = Broker(configuration: configuration.broker, engine: engine, logger: recorder.logger)
        let shared = ServerShared(
            configuration: configuration, broker: broker, logger: recorder.logger, operations: operations)
        let channel = try ConnectionHandlerTests.connectedChannel()
        try channel.pipeline.syncOperations.addHandler(
            WebSocketHandler(shared: shared, remoteAddress: nil, eventLoop: channel.eventLoop))
        try ConnectionHandlerTests.sendFrame(ConnectionHandlerTests.handshake, channel)
        let reply = try ConnectionHandlerTests.frames(channel)
        let clientId = try #require(reply.first?.arrayValue?.first?.objectValue?["clientId"]?.stringValue)
        return (channel, clientId)
    }

    /// Frames of publishes all reach the engine before it answered any; the replies follow its answers.
    @Test func framesOfPublishesDoNotWaitForTheEnginesAnswers() throws {
        let engine = HeldAnswersEngine()
        let (channel, clientId) = try Self.webSocket(engine)
        try ConnectionHandlerTests.sendFrame("[\(Self.publish(1, clientId))]", channel)
        try ConnectionHandlerTests.sendFrame("[\(Self.publish(2, clientId)),\(Self.publish(3, clientId))]", channel)
        try ConnectionHandlerTests.sendFrame(Self.publish(4, clientId), channel)
        #expect(engine.handed.withLockedValue { $0 } == ["publish 1", "publish 2", "publish 3", "publish 4"])
        #expect(try Self.replyIds(channel) == [], "nothing is answered before the engine answers")
        engine.answerPublishes()
        channel.embeddedEventLoop.run()
        #expect(try Self.replyIds(channel) == ["p1", "p2", "p3", "p4"])
        _ = try channel.finish()
    }

    /// A meta message waits for the publishes before it, and what follows waits for it: a subscribe is handed to
    /// the engine after the publishes sent before it, and before those sent after it (its subscriber may be the
    /// publisher), whether they come in frames of their own or in one frame.
    @Test(arguments: [false, true])
    func aMetaMessageWaitsForThePublishesBeforeIt(inOneFrame: Bool) throws {
        let engine = HeldAnswersEngine()
        let (channel, clientId) = try Self.webSocket(engine)
        let messages = [
            Self.publish(1, clientId),
            #"{"channel":"/meta/subscribe","clientId":"\#(clientId)","subscription":"/p","id":"s"}"#,
            Self.publish(2, clientId),
        ]
        if inOneFrame {
            try ConnectionHandlerTests.sendFrame("[" + messages.joined(separator: ",") + "]", channel)
        } else {
            for message in messages { try ConnectionHandlerTests.sendFrame("[\(message)]", channel) }
        }
        #expect(engine.handed.withLockedValue { $0 } == ["publish 1"], "the subscribe waits for publish 1")
        engine.answerPublishes()
        channel.embeddedEventLoop.run()
        #expect(engine.handed.withLockedValue { $0 } == ["publish 1", "subscribe /p", "publish 2"])
        engine.answerPublishes()
        channel.embeddedEventLoop.run()
        #expect(try Self.replyIds(channel) == ["p1", "s", "p2"])
        _ = try channel.finish()
    }

    /// At most `FramesInFlight.maxCount` frames wait for the engine; the next waits in the parser until one is
    /// answered.
    @Test func framesInFlightAreBounded() throws {
        let engine = HeldAnswersEngine()
        let (channel, clientId) = try Self.webSocket(engine)
        let count = Int(FramesInFlight.maxCount)
        for n in 1...(count + 2) { try ConnectionHandlerTests.sendFrame(Self.publish(n, clientId), channel) }
        #expect(engine.handed.withLockedValue { $0.count } == count)
        engine.answerPublishes()
        channel.embeddedEventLoop.run()
        #expect(engine.handed.withLockedValue { $0.count } == count + 2)
        engine.answerPublishes()
        channel.embeddedEventLoop.run()
        #expect(try Self.replyIds(channel) == (1...(count + 2)).map { "p\($0)" })
        _ = try channel.finish()
    }
}
