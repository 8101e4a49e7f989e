import Bayeux
import Dispatch
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import PubSubTesting
import Testing

@testable import PubSubCore

/// The memory engine's sessions are split into shards, each queued under its own lock. Publishers on several
/// threads at once must still give every subscriber, whichever shard it is in, every event once and in one
/// order; a subscriber that resumes while events are on their way through the shards gets each event once.
@Suite struct ShardedFanOutTests {
    /// Runs `bodies` on threads of their own at once, and returns when all have.
    private func runTogether(_ bodies: [@Sendable () -> Void]) {
        let done = DispatchGroup()
        for body in bodies {
            done.enter()
            Thread {
                body()
                done.leave()
            }.start()
        }
        done.wait()
    }

    /// Waits on this thread until `condition` holds, for at most 20 s (then the test's expectations fail).
    private func waitHere(until condition: () -> Bool) {
        let deadline = Date().addingTimeInterval(20)
        while !condition(), Date() < deadline { Thread.sleep(forTimeInterval: 0.001) }
    }

    /// The positions (sequences) of what a sink got, in order.
    private func sequences(_ sink: RecordingSink, _ engine: MemoryEngine) -> [UInt64] {
        sink.events.compactMap { event -> UInt64? in
            guard let token = event.objectValue?["ext"]?.objectValue?["position"]?.stringValue else { return nil }
            return Position(token: token, key: engine.positionKey)?.sequence
        }
    }

    /// A new client whose session is not in the first shard (the one `resumeWithAPublisherHeld` locks).
    private func clientOutsideTheFirstShard(_ engine: MemoryEngine, on loop: any EventLoop) async throws -> String {
        var id = try await engine.createClient(now: .now(), user: nil, on: loop).get()
        while engine.shardNumber(for: id) == 0 {
            id = try await engine.createClient(now: .now(), user: nil, on: loop).get()
        }
        return id
    }

    /// Holds the first shard's lock (a busy shard), has another thread publish to `/c/0` (it puts its event in
    /// the history, sequence `sequence`, then waits at that shard), subscribes `clientId` to `channels` resuming
    /// from `token` meanwhile, then lets the publisher go on.
    private func resumeWithAPublisherHeld(
        _ engine: MemoryEngine, clientId: String, to channels: [String], from token: String, sequence: UInt64,
        on loop: any EventLoop
    ) -> (SubscriptionResult, ResumeResult?) {
        let answer = NIOLockedValueBox<(SubscriptionResult, ResumeResult?)>((.unknownClient, nil))
        runTogether([
            { [self] in
                engine.shards[0].lock.lock()
                Thread {
                    _ = engine.publish(message(thread: 0, n: Int(sequence)), to: "/c/0", now: .now(), on: loop)
                }.start()
                waitHere { engine.lock.withLock { engine.history.lastSequence } >= sequence }
                let result = try! engine.subscribe(clientId, to: channels, resume: token, now: .now(), on: loop).wait()
                answer.withLockedValue { $0 = result }
                engine.shards[0].lock.unlock()
            }
        ])
        return answer.withLockedValue { $0 }
    }

    private func message(thread: Int, n: Int) -> Message {
        var message = Message()
        message.channel = "/c/\(thread)"
        message["data"] = .object(["thread": JSONValue(thread), "n": JSONValue(n)])
        return message
    }

    /// (thread, n) of each event a sink got.
    private func published(_ sink: RecordingSink) -> [[Int]] {
        sink.events.map { event in
            let data = event.objectValue?["data"]?.objectValue
            return [data?["thread"], data?["n"]].map { $0?.doubleValue.map { Int($0) } ?? -1 }
        }
    }

    private func waitFor(_ sinks: [RecordingSink], count: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while sinks.contains(where: { $0.events.count < count }), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    @Test(arguments: [false, true])
    func everySubscriberInEveryShardSeesTheSameOrder(history: Bool) async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        var configuration = BrokerConfiguration()
        configuration.historySize = history ? 10_000 : 0
        configuration.maxQueue = 10_000
        let engine = MemoryEngine(configuration: configuration, epoch: 7, shards: 8)
        #expect(engine.shards.count == 8)
        var sinks: [RecordingSink] = []
        var ids: [String] = []
        for n in 0..<24 {
            let loop = group.next()
            let id = try await engine.createClient(now: .now(), user: nil, on: loop).get()
            _ = try await engine.subscribe(id, to: ["/c/**"], resume: nil, now: .now(), on: loop).get()
            let sink = RecordingSink(loop: n % 2 == 0 ? loop : group.next(), persistent: true)
            let connected = try await engine.connect(
                id, now: .now(), sink: sink, receipt: ConnectReceipt(connectId: nil, ack: nil), on: loop
            ).get()
            #expect(connected.status == .ok)
            sinks.append(sink)
            ids.append(id)
        }
        #expect(Set(ids.map(engine.shardNumber(for:))).count > 1, "the subscribers are spread over shards")

        let threads = 4
        let each = 300
        let loop = group.next()
        runTogether(
            (0..<threads).map { thread in
                { [self] in
                    for n in 0..<each {
                        _ = engine.publish(message(thread: thread, n: n), to: "/c/\(thread)", now: .now(), on: loop)
                    }
                }
            })
        let total = threads * each
        try await waitFor(sinks, count: total)
        let first = published(sinks[0])
        #expect(first.count == total)
        for thread in 0..<threads {
            #expect(first.filter { $0[0] == thread }.map { $0[1] } == Array(0..<each), "each publisher's order")
        }
        for (n, sink) in sinks.enumerated().dropFirst() {
            let same = published(sink) == first
            #expect(same, "subscriber \(n) saw another order than subscriber 0")
        }
        if history {
            let inOrder = sequences(sinks[5], engine) == Array(1...UInt64(total))
            #expect(inOrder, "position order")
        }
        #expect(engine.statistics.queued == UInt64(total * sinks.count))
        #expect(engine.statistics.published == UInt64(total))
        for shard in engine.shards { #expect(shard.lock.withLock { shard.early.isEmpty }) }
        try await group.shutdownGracefully()
    }

    /// Subscribers resume from the latest position while four threads publish: each gets every event after
    /// its position once, in position order, whether the history or the live fan-out brought it.
    @Test func aResumeWhileEventsCrossTheShardsGetsEachEventOnce() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        var configuration = BrokerConfiguration()
        configuration.historySize = 10_000
        configuration.maxQueue = 10_000
        let engine = MemoryEngine(configuration: configuration, epoch: 9, shards: 8)
        let loop = group.next()
        let threads = 4
        let each = 400
        let joined = NIOLockedValueBox<[(sink: RecordingSink, after: UInt64)]>([])
        let started = NIOLockedValueBox(false)
        var bodies: [@Sendable () -> Void] = (0..<threads).map { thread in
            { [self] in
                for n in 0..<each {
                    if n == 20 { started.withLockedValue { $0 = true } }
                    _ = engine.publish(message(thread: thread, n: n), to: "/c/\(thread)", now: .now(), on: loop)
                }
            }
        }
        bodies.append {
            waitHere { started.withLockedValue { $0 } }
            for n in 0..<24 {
                let token = engine.position!
                let after = Position(token: token, key: engine.positionKey)!.sequence
                let id = try! engine.createClient(now: .now(), user: nil, on: loop).wait()
                let sink = RecordingSink(loop: group.next(), persistent: true)
                _ = try! engine.connect(
                    id, now: .now(), sink: sink, receipt: ConnectReceipt(connectId: nil, ack: nil), on: loop
                ).wait()
                let pattern = n % 3 == 0 ? "/c/**" : "/c/*"
                let (result, resumed) = try! engine.subscribe(
                    id, to: [pattern], resume: token, now: .now(), on: loop
                ).wait()
                precondition(result == .ok && resumed?.recovered == true)
                joined.withLockedValue { $0.append((sink, after)) }
            }
        }
        runTogether(bodies)
        let total = UInt64(threads * each)
        let late = joined.withLockedValue { $0 }
        #expect(late.count == 24)
        #expect(late.contains { $0.after < total }, "some joined while events were being published")
        for (sink, after) in late {
            try await waitFor([sink], count: Int(total - after))
            let got = sequences(sink, engine)
            let expected = Array((after + 1)..<(total + 1))
            let shorter = min(got.count, expected.count)
            let differ = (0..<shorter).first { got[$0] != expected[$0] } ?? shorter
            let same = got == expected
            #expect(
                same,
                "after \(after): \(got.count) events, expected \(expected.count); from index \(differ): \(got.dropFirst(differ).prefix(5)) instead of \(expected.dropFirst(differ).prefix(5))"
            )
        }
        try await group.shutdownGracefully()
    }

    /// A publisher has put its event in the history and is held before the shards (one of them is locked, as a
    /// busy one would be); a subscriber in another shard resumes from before that event. It gets the event once,
    /// from the history: its shard is caught up before the subscription is added, and the publisher, when it
    /// gets there, finds the event queued.
    @Test func aResumeBetweenTheHistoryAndTheFanOutGetsTheEventOnce() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        var configuration = BrokerConfiguration()
        configuration.historySize = 100
        let engine = MemoryEngine(configuration: configuration, epoch: 11, shards: 4)
        let id = try await clientOutsideTheFirstShard(engine, on: loop)
        let sink = RecordingSink(loop: loop, persistent: true)
        _ = try await engine.connect(
            id, now: .now(), sink: sink, receipt: ConnectReceipt(connectId: nil, ack: nil), on: loop
        ).get()
        let token = try #require(engine.position)
        let (result, resumed) = resumeWithAPublisherHeld(
            engine, clientId: id, to: ["/c/**"], from: token, sequence: 1, on: loop)
        #expect(result == .ok)
        #expect(resumed == ResumeResult(recovered: true, missed: 1))
        _ = engine.publish(message(thread: 0, n: 1), to: "/c/0", now: .now(), on: loop)
        try await waitFor([sink], count: 2)
        #expect(sequences(sink, engine) == [1, 2], "the held event once, then the next")
        try await group.shutdownGracefully()
    }

    /// The same held publisher, and the resuming subscriber's queue is full: bringing its shard up to the history
    /// drops it for overflow, and the subscribe says so instead of subscribing a session that is gone.
    @Test func aResumeWhoseCatchUpOverflowsTheSessionIsToldOverflowed() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        var configuration = BrokerConfiguration()
        configuration.historySize = 100
        configuration.maxQueue = 2
        let engine = MemoryEngine(configuration: configuration, epoch: 13, shards: 4)
        let id = try await clientOutsideTheFirstShard(engine, on: loop)
        _ = try await engine.subscribe(id, to: ["/c/**"], resume: nil, now: .now(), on: loop).get()
        // No connection attached: two events fill the queue.
        for n in 0..<2 { _ = engine.publish(message(thread: 0, n: n), to: "/c/0", now: .now(), on: loop) }
        let token = try #require(engine.position)
        let (result, _) = resumeWithAPublisherHeld(engine, clientId: id, to: ["/d"], from: token, sequence: 3, on: loop)
        #expect(result == .overflowed)
        #expect(!engine.hasSession(id))
        #expect(engine.statistics.subscriptions == 0, "nothing left in an index")
        #expect(engine.statistics.overflowDrops == 1)
        try await group.shutdownGracefully()
    }
}
