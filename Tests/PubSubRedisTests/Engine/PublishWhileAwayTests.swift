import Bayeux
import Logging
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// A publish while the node cannot reach Redis: refused by default, so that nothing is acknowledged that the other
/// nodes' subscribers would never get; delivered to this node's subscribers only with `--redis-when-away local`.
@Suite(.serialized, .timeLimit(.minutes(1))) struct PublishWhileAwayTests {
    @Test(arguments: RedisEngineConfiguration.PublishWhileAway.allCases)
    func aPublishWhileRedisIsDownIsRefusedOrKeptOnThisNode(_ mode: RedisEngineConfiguration.PublishWhileAway)
        async throws
    {
        let server = try await RedisServer.start()
        defer { server.stop() }
        let configuration = BrokerConfiguration()
        var settings = RedisEngineConfiguration(redis: try RedisConfiguration(url: server.url))
        settings.whenAway = mode
        let engine = RedisEngine(configuration: configuration, settings: settings, logger: Logger(label: "test"))
        try await engine.start(timeout: .seconds(10)).get()
        let loop = engine.commands.eventLoop
        let broker = Broker(configuration: configuration, engine: engine)
        let node = Node(broker: broker, redis: engine, loop: loop)
        let cid = try await node.handshake()
        _ = try await node.subscribe(cid, "/a")
        let sink = RecordingSink(loop: loop, persistent: true)
        _ = try await node.connect(cid, sink: sink, type: "websocket")
        #expect(try await node.publish("/a", "1")["successful"] == .bool(true))
        #expect(try await waitUntil { sink.data == [1] })

        server.stop()
        #expect(try await waitUntil { !engine.isConnected })
        let reply = try await node.publish("/a", "2")
        let api = try await broker.publishFromAPI(channel: "/a", data: 3, ext: nil, now: node.now, on: loop)
            .map { _ in nil as PublishRefused? }.recover { $0 as? PublishRefused }.get()
        try await loop.submit {}.get()
        switch mode {
        case .refuse:
            #expect(reply["successful"] == .bool(false))
            #expect(reply["error"] == .string("407:/a:Failed to publish"))
            #expect(api?.reason.hasPrefix("Redis is unreachable") == true)
            #expect(engine.redisStatistics.refusedPublishes == 2)
            #expect(engine.redisStatistics.localOnlyPublishes == 0)
            #expect(sink.data == [1])
        case .local:
            #expect(reply["successful"] == .bool(true))
            #expect(api == nil)
            #expect(engine.redisStatistics.refusedPublishes == 0)
            #expect(engine.redisStatistics.localOnlyPublishes == 2)
            #expect(try await waitUntil { sink.data == [1, 2, 3] })
        }
        await engine.close()
    }
}
