import NIOCore
import NIOPosix
import PubSubCore
import PubSubTesting
import Testing
@testable import PubSubRedis

/// The fan-in of a connection over shards, driven through its proxies as the shards' local stores drive them
/// (no Redis: the shards' engines are never started, so their sessions are local only).
@Suite struct ShardFanInTests {
    func withEngine(maxQueue: Int, _ body: (RedisShardedEngine, any EventLoop) async throws -> Void) async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let engine = RedisShardedEngine(
            configuration: BrokerConfiguration(maxQueue: maxQueue), settings: RedisEngineConfiguration(),
            map: try ShardMap(prefix: "t:", count: 3))
        do {
            try await body(engine, group.next())
        } catch {
            await engine.close()
            try? await group.shutdownGracefully()
            throw error
        }
        await engine.close()
        try await group.shutdownGracefully()
    }

    static func events(_ n: Int) -> CircularBuffer<ByteBuffer> {
        CircularBuffer((0..<n).map { ByteBuffer(string: #"[{"channel":"/a","data":\#($0)}]"#) })
    }

    /// What arrives while the shards connect waits, up to `--max-queue` per shard; past that the client is a
    /// slow consumer: dropped, and told so, once.
    @Test func deliveriesWhileConnectingAreBoundedByTheQueueLimit() async throws {
        try await withEngine(maxQueue: 2) { engine, loop in
            let sink = RecordingSink(loop: loop, persistent: true)
            let fanIn = ShardFanIn(engine: engine, clientId: "c", sink: sink, shards: 3)
            #expect(fanIn.limit == 6)
            fanIn.all[1].deliver(Self.events(4))
            fanIn.all[2].deliver(Self.events(2))
            #expect(sink.detaches.isEmpty && sink.events.isEmpty)
            fanIn.all[0].deliver(Self.events(1))
            #expect(sink.detaches == [.overflow])
            fanIn.all[2].deliver(Self.events(1))
            fanIn.all[1].detached(.overflow)
            #expect(sink.detaches == [.overflow] && sink.events.isEmpty)
            #expect(fanIn.takeProxies().isEmpty)
        }
    }

    /// Below the bound, what waited goes with the connect's answer, and later deliveries go straight through.
    @Test func whatWaitedGoesWithTheAnswerThenDeliveriesFlow() async throws {
        try await withEngine(maxQueue: 2) { engine, loop in
            let sink = RecordingSink(loop: loop, persistent: true)
            let fanIn = ShardFanIn(engine: engine, clientId: "c", sink: sink, shards: 3)
            fanIn.all[1].deliver(Self.events(2))
            let (early, armed) = fanIn.settle(attach: true)
            #expect(armed && early.count == 2)
            fanIn.all[2].deliver(Self.events(3))
            #expect(sink.events.count == 3)
            // The first detach is passed on once; the others are not.
            fanIn.all[0].detached(.superseded)
            fanIn.all[2].detached(.superseded)
            #expect(sink.detaches == [.superseded])
        }
    }

    /// A one-shot sink that found events waiting is answered with them at once, and is then done.
    @Test func aOneShotSinkIsAnsweredOnce() async throws {
        try await withEngine(maxQueue: 10) { engine, loop in
            let sink = RecordingSink(loop: loop, persistent: false)
            let fanIn = ShardFanIn(engine: engine, clientId: "c", sink: sink, shards: 3)
            let (none, armed) = fanIn.settle(attach: true)
            #expect(armed && none.isEmpty)
            fanIn.all[1].deliver(Self.events(2))
            #expect(sink.events.count == 2)
            fanIn.all[2].deliver(Self.events(1))
            #expect(sink.events.count == 2, "a late delivery goes back to its shard's queue, not to the answered sink")
        }
    }
}
