import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// What the Redis engine logs that no connection can: a polling client dropped for overflow between two polls.
@Suite(.serialized, .timeLimit(.minutes(1))) struct RedisEngineLoggingTests {
    struct Handler: LogHandler {
        let lines: NIOLockedValueBox<[(String, Logger.Metadata)]>
        var logLevel: Logger.Level = .info
        var metadata: Logger.Metadata = [:]
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) { lines.withLockedValue { $0.append(("\(event.message)", event.metadata ?? [:])) } }
    }

    @Test func aPollingClientDroppedBetweenPollsIsLoggedWithItsId() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        let lines = NIOLockedValueBox<[(String, Logger.Metadata)]>([])
        let configuration = BrokerConfiguration(maxQueue: 3)
        let engine = RedisEngine(
            configuration: configuration,
            settings: RedisEngineConfiguration(redis: try RedisConfiguration(url: server.url)),
            logger: Logger(label: "test") { _ in Handler(lines: lines) })
        try await engine.start(timeout: .seconds(10)).get()
        let loop = engine.commands.eventLoop
        let node = Node(broker: Broker(configuration: configuration, engine: engine), redis: engine, loop: loop)
        let slow = try await node.handshake()
        let attached = try await node.handshake()
        _ = try await node.connect(slow)
        _ = try await node.subscribe(slow, "/a")
        _ = try await node.subscribe(attached, "/a")
        // The attached client's connection logs its own drop; the engine says nothing of it.
        _ = try await node.connect(attached, sink: RecordingSink(loop: loop, persistent: true), type: "websocket")
        for _ in 0..<5 { _ = try await node.publish("/a") }
        try await node.settle()
        let drops = lines.withLockedValue { $0 }.filter { $0.0 == "slow consumer dropped: queue overflow" }
        #expect(drops.count == 1)
        #expect(drops.first?.1["pubsub.client.id"] == .string(slow))
        #expect(try await engine.clientExists(slow, on: loop).get() == false)
        await engine.close()
    }
}
