import Bayeux
import Logging
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// `--redis-wait-replicas`: a publish is acknowledged once that many replicas hold it, against a real master and
/// replica; one they do not confirm in time is answered with an error and counted.
@Suite(.serialized, .timeLimit(.minutes(1))) struct WaitReplicasTests {
    @Test func aPublishIsAcknowledgedOnceTheReplicaHoldsItAndAnErrorWhenItDoesNot() async throws {
        let master = try await RedisServer.start()
        defer { master.stop() }
        let replica = try await RedisServer.start(arguments: ["--replicaof", "127.0.0.1", "\(master.port)"])
        defer { replica.stop() }
        let configuration = BrokerConfiguration()
        var settings = RedisEngineConfiguration(redis: try RedisConfiguration(url: master.url))
        settings.waitReplicas = 1
        // Long enough for a loaded machine's replica to confirm; the phase without one waits it out once.
        settings.waitTimeout = .seconds(3)
        let engine = RedisEngine(configuration: configuration, settings: settings, logger: Logger(label: "test"))
        try await engine.start(timeout: .seconds(10)).get()
        let loop = engine.commands.eventLoop
        let node = Node(broker: Broker(configuration: configuration, engine: engine), redis: engine, loop: loop)
        #expect(
            try await waitUntil {
                let info = try await engine.commands.send(RESPCommand(["INFO", "replication"])).get().string ?? ""
                return info.contains("state=online")
            })
        let cid = try await node.handshake()
        _ = try await node.subscribe(cid, "/a")
        let sink = RecordingSink(loop: loop, persistent: true)
        _ = try await node.connect(cid, sink: sink, type: "websocket")

        #expect(try await node.publish("/a", "1")["successful"] == .bool(true))
        let replicated = try await engine.publish(
            Message(["channel": "/a", "data": 2]), to: "/a", now: node.now, on: loop
        ).get()
        #expect(replicated != nil)
        #expect(engine.redisStatistics.unreplicatedPublishes == 0)

        // The replica gone, the master still takes the write (and delivers it) but nobody confirms it.
        replica.stop()
        await #expect(throws: PublishUncertain.self) {
            _ = try await engine.publish(
                Message(["channel": "/a", "data": 3]), to: "/a", now: node.now, on: loop
            ).get()
        }
        #expect(engine.redisStatistics.unreplicatedPublishes == 1)
        #expect(engine.redisStatistics.uncertainPublishes == 0)
        #expect(try await waitUntil { sink.data == [1, 2, 3] })
        await engine.close()
    }
}
