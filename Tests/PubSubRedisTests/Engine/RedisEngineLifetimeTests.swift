import Logging
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// The engine owns its two Redis connections and its Sentinel monitor, whose callbacks reach it back: they hold
/// it weakly, so that a closed engine is freed with everything it owns.
@Suite(.serialized, .timeLimit(.minutes(1))) struct RedisEngineLifetimeTests {
    final class Weak: @unchecked Sendable {
        weak var engine: RedisEngine?
        weak var commands: RedisClient?
        weak var subscriber: RedisClient?
    }

    /// Starts an engine, has it serve one session, closes it; returns weak references to it and its clients.
    func servedAndClosed(_ settings: RedisEngineConfiguration) async throws -> Weak {
        let weak = Weak()
        let configuration = BrokerConfiguration()
        let engine = RedisEngine(configuration: configuration, settings: settings, logger: Logger(label: "test"))
        weak.engine = engine
        weak.commands = engine.commands
        weak.subscriber = engine.subscriber
        try await engine.start(timeout: .seconds(10)).get()
        let loop = engine.commands.eventLoop
        let node = Node(broker: Broker(configuration: configuration, engine: engine), redis: engine, loop: loop)
        let cid = try await node.handshake()
        _ = try await node.subscribe(cid, "/a")
        _ = try await node.publish("/a", "1")
        await engine.close()
        return weak
    }

    @Test func aClosedEngineIsFreedWithItsConnections() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let weak = try await servedAndClosed(RedisEngineConfiguration(redis: try RedisConfiguration(url: redis.url)))
        #expect(try await waitUntil { weak.engine == nil && weak.commands == nil && weak.subscriber == nil })
    }

    @Test func aClosedSentinelEngineIsFreedWithItsConnections() async throws {
        let master = try await RedisServer.start()
        defer { master.stop() }
        let sentinel = try await RedisSentinelServer.start(watching: master)
        defer { sentinel.stop() }
        var settings = RedisEngineConfiguration(redis: RedisConfiguration(port: 1), sweepPeriod: .zero)
        settings.sentinel = RedisSentinelConfiguration(
            sentinels: [sentinel.endpoint], masterName: "mymaster", confirmInterval: .milliseconds(50))
        let weak = try await servedAndClosed(settings)
        #expect(try await waitUntil { weak.engine == nil && weak.commands == nil && weak.subscriber == nil })
    }
}
