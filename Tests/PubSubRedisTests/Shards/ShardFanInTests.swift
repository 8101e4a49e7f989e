import NIOConcurrencyHelpers
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

    static func events(_ n: Int) -> CircularBuffer<WireEvent> {
        CircularBuffer((0..<n).map { WireEvent(json: ByteBuffer(string: #"[{"channel":"/a","data":\#($0)}]"#)) })
    }

    /// What arrives while the shards connect waits, up to `--max-queue` per shard; past that the client is a
    /// slow consumer: dropped, and told so, once.
    @Test func deliveriesWhileConnectingAreBoundedByTheQueueLimit() async throws {
        try await withEngine(maxQueue: 2) { engine, loop in
            let sink = RecordingSink(loop: loop, persistent: true)
            let fanIn = ShardFanIn(engine: engine, clientId: "c", sink: sink, shards: 3)
            let proxies = fanIn.all
            #expect(fanIn.limit == 6)
            proxies[1].deliver(Self.events(4))
            proxies[2].deliver(Self.events(2))
            #expect(sink.detaches.isEmpty && sink.events.isEmpty)
            proxies[0].deliver(Self.events(1))
            #expect(sink.detaches == [.overflow])
            proxies[2].deliver(Self.events(1))
            proxies[1].detached(.overflow)
            #expect(sink.detaches == [.overflow] && sink.events.isEmpty)
            #expect(fanIn.takeProxies().isEmpty)
        }
    }

    /// Below the bound, what waited goes with the connect's answer, and later deliveries go straight through.
    @Test func whatWaitedGoesWithTheAnswerThenDeliveriesFlow() async throws {
        try await withEngine(maxQueue: 2) { engine, loop in
            let sink = RecordingSink(loop: loop, persistent: true)
            let fanIn = ShardFanIn(engine: engine, clientId: "c", sink: sink, shards: 3)
            let proxies = fanIn.all
            proxies[1].deliver(Self.events(2))
            let (early, armed) = fanIn.settle(attach: true)
            #expect(armed && early.count == 2)
            proxies[2].deliver(Self.events(3))
            #expect(sink.events.count == 3)
            // The first detach is passed on once; the others are not.
            proxies[0].detached(.superseded)
            proxies[2].detached(.superseded)
            #expect(sink.detaches == [.superseded])
        }
    }

    /// A one-shot sink that found events waiting is answered with them at once, and is then done.
    @Test func aOneShotSinkIsAnsweredOnce() async throws {
        try await withEngine(maxQueue: 10) { engine, loop in
            let sink = RecordingSink(loop: loop, persistent: false)
            let fanIn = ShardFanIn(engine: engine, clientId: "c", sink: sink, shards: 3)
            let proxies = fanIn.all
            let (none, armed) = fanIn.settle(attach: true)
            #expect(armed && none.isEmpty)
            proxies[1].deliver(Self.events(2))
            #expect(sink.events.count == 2)
            proxies[2].deliver(Self.events(1))
            #expect(sink.events.count == 2, "a late delivery goes back to its shard's queue, not to the answered sink")
        }
    }
    /// Weak references to a fan-in, its proxies and the connection's sink: all nil once the fan-in is done and the
    /// test lets go (a strong cycle between the fan-in and its proxies kept every long-poll connect before).
    struct Freed {
        weak var fanIn: ShardFanIn?
        weak var sink: RecordingSink?
        var proxies: [Weak] = []
        struct Weak { weak var proxy: ShardFanIn.Proxy? }

        var allFreed: Bool { fanIn == nil && sink == nil && proxies.allSatisfy { $0.proxy == nil } }
    }

    /// Builds a fan-in registered with the engine, as `connect` does, runs `end` on it, and lets go of it.
    func endFanIn(
        _ engine: RedisShardedEngine, _ loop: any EventLoop, persistent: Bool,
        _ end: (ShardFanIn, [ShardFanIn.Proxy], RecordingSink) -> Void
    ) -> Freed {
        let sink = RecordingSink(loop: loop, persistent: persistent)
        let fanIn = ShardFanIn(engine: engine, clientId: "c", sink: sink, shards: 3)
        engine.fanIns.withLockedValue { $0["c"] = fanIn }
        let proxies = fanIn.all
        var freed = Freed(fanIn: fanIn, sink: sink)
        freed.proxies = proxies.map { Freed.Weak(proxy: $0) }
        end(fanIn, proxies, sink)
        return freed
    }

    @Test func aOneShotAnswerFreesTheFanInItsProxiesAndTheSink() async throws {
        try await withEngine(maxQueue: 10) { engine, loop in
            let freed = endFanIn(engine, loop, persistent: false) { fanIn, proxies, sink in
                _ = fanIn.settle(attach: true)
                proxies[1].deliver(Self.events(2))
                #expect(sink.events.count == 2)
            }
            #expect(freed.allFreed)
            #expect(engine.fanIns.withLockedValue { $0.isEmpty })
        }
    }

    @Test(arguments: [DetachReason.superseded, .disconnected, .kicked, .expired])
    func aDetachFreesTheFanInItsProxiesAndTheSink(_ reason: DetachReason) async throws {
        try await withEngine(maxQueue: 10) { engine, loop in
            let freed = endFanIn(engine, loop, persistent: true) { fanIn, proxies, sink in
                _ = fanIn.settle(attach: true)
                proxies[2].deliver(Self.events(1))
                proxies[0].detached(reason)
                #expect(sink.detaches == [reason])
            }
            #expect(freed.allFreed)
            #expect(engine.fanIns.withLockedValue { $0.isEmpty })
        }
    }

    @Test func anOverflowFreesTheFanInItsProxiesAndTheSink() async throws {
        try await withEngine(maxQueue: 1) { engine, loop in
            let freed = endFanIn(engine, loop, persistent: true) { _, proxies, sink in
                proxies[1].deliver(Self.events(4))
                #expect(sink.detaches == [.overflow])
            }
            #expect(freed.allFreed)
            #expect(engine.fanIns.withLockedValue { $0.isEmpty })
        }
    }

    /// A connect that could not attach everywhere (a shard's connect failed, a shard refused) is abandoned.
    @Test func aFailedConnectFreesTheFanInItsProxiesAndTheSink() async throws {
        try await withEngine(maxQueue: 10) { engine, loop in
            let freed = endFanIn(engine, loop, persistent: false) { fanIn, proxies, _ in
                proxies[1].deliver(Self.events(1))
                engine.abandon(fanIn)
            }
            #expect(freed.allFreed)
            #expect(engine.fanIns.withLockedValue { $0.isEmpty })
        }
    }

    /// The engine lets go of a connection's sink when the connection detaches it (a parked poll that timed out).
    @Test func anEngineDetachFreesTheFanInItsProxiesAndTheSink() async throws {
        try await withEngine(maxQueue: 10) { engine, loop in
            let freed = endFanIn(engine, loop, persistent: false) { fanIn, _, sink in
                _ = fanIn.settle(attach: true)
                _ = engine.detach("c", sink: sink, takeEvents: true)
            }
            #expect(freed.allFreed)
            #expect(engine.fanIns.withLockedValue { $0.isEmpty })
        }
    }
}
