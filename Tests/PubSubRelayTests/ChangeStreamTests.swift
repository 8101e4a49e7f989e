import NIOCore
import Synchronization
import Testing

@testable import PubSubRelay

@Suite(.timeLimit(.minutes(1))) struct ChangeStreamTests {
    static func batch(_ position: String, changes: Int = 1) -> ChangeBatch {
        ChangeBatch(
            changes: (0..<changes).map {
                Change(
                    collection: ["c"], id: "\(position).\($0)", operation: .insert,
                    seq: position)
            },
            position: position)
    }

    /// Waits until `condition` holds (the producer's state is seen from outside only through it).
    static func eventually(_ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while !condition() {
            guard ContinuousClock.now < deadline else { throw CancellationError() }
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    @Test func aBatchIsHandedOverTheMomentItIsYielded() async throws {
        let stream = ChangeStream(capacity: 4)
        let consumer = Task { try await stream.next() }
        try await Task.sleep(for: .milliseconds(20))
        try await stream.yield(Self.batch("1"))
        #expect(try await consumer.value?.position == "1")
    }

    @Test func theProducerWaitsOnceCapacityBatchesWaitUntilHalfAreTaken() async throws {
        let stream = ChangeStream(capacity: 4)
        let produced = ManagedCounter()
        let producer = Task {
            for index in 0..<10 {
                try await stream.yield(Self.batch("\(index)", changes: 2))
                produced.increment()
            }
        }
        // The fourth yield reaches the high watermark and waits there.
        try await Self.eventually { produced.value == 3 }
        try await Task.sleep(for: .milliseconds(50))
        #expect(produced.value == 3)
        #expect(stream.bufferedChanges == 8)
        // Taking down below half (2 of 4) calls for more.
        #expect(try await stream.next()?.position == "0")
        try await Task.sleep(for: .milliseconds(20))
        #expect(produced.value == 3)
        #expect(try await stream.next()?.position == "1")
        #expect(try await stream.next()?.position == "2")
        try await Self.eventually { produced.value > 3 }
        var positions: [String] = []
        while positions.last != "9", let batch = try await stream.next() { positions.append(batch.position) }
        #expect(positions == (3..<10).map { "\($0)" })
        try await producer.value
        #expect(stream.bufferedChanges == 0)
    }

    @Test func finishHandsOutWhatWaitsThenEndsOrThrows() async throws {
        let stream = ChangeStream(capacity: 4)
        try await stream.yield(Self.batch("1"))
        stream.finish()
        #expect(try await stream.next()?.position == "1")
        #expect(try await stream.next() == nil)

        struct Gone: Error {}
        let failing = ChangeStream(capacity: 4)
        try await failing.yield(Self.batch("1"))
        failing.finish(throwing: Gone())
        #expect(try await failing.next()?.position == "1")
        await #expect(throws: Gone.self) { try await failing.next() }
    }

    @Test func aWaitingProducerStopsWhenCancelledOrWhenTheConsumerIsGone() async throws {
        let stream = ChangeStream(capacity: 2)
        try await stream.yield(Self.batch("1"))
        // The second batch fills the stream: its yield waits for the consumer.
        let producer = Task { try await stream.yield(Self.batch("2")) }
        try await Task.sleep(for: .milliseconds(20))
        producer.cancel()
        await #expect(throws: CancellationError.self) { try await producer.value }

        // The consumer's task cancelled: the stream is over, a yield throws at once.
        let other = ChangeStream(capacity: 1)
        let consumer = Task { try await other.next() }
        try await Task.sleep(for: .milliseconds(20))
        consumer.cancel()
        _ = try? await consumer.value
        await #expect(throws: CancellationError.self) {
            try await other.yield(Self.batch("1"))
            try await other.yield(Self.batch("2"))
        }
    }

    @Test func collectorMakesBatchesOfAtMostTheLimitEndingAtAPosition() {
        var collector = BatchCollector(limit: 2)
        let change = { (id: String) in Change(collection: ["c"], id: id, operation: .insert, seq: id) }
        #expect(collector.flush() == nil)
        #expect(collector.add(change("a"), position: "a") == nil)
        #expect(collector.add(change("b"), position: "b") == nil)
        // A third change: the two before go as a full batch.
        let full = collector.add(change("c"), position: "c")
        #expect(full?.changes.map(\.id) == ["a", "b"] && full?.position == "b")
        // A position without a change joins the batch in progress.
        #expect(collector.add(nil, position: "last") == nil)
        let rest = collector.flush()
        #expect(rest?.changes.map(\.id) == ["c"] && rest?.position == "last")
        #expect(collector.isEmpty)

        // A resync starts a batch of its own, and survives a lost connection until a batch carries it.
        _ = collector.add(change("d"), position: "d")
        let before = collector.startResync(Resync(reason: "gone"))
        #expect(before?.changes.map(\.id) == ["d"] && before?.resync == nil)
        _ = collector.add(change("e"), position: "e")
        collector.reset()
        #expect(collector.flush() == nil)
        _ = collector.add(change("e"), position: "e")
        let resync = collector.flush()
        #expect(resync?.resync?.reason == "gone" && resync?.changes.map(\.id) == ["e"])
        _ = collector.add(change("f"), position: "f")
        #expect(collector.flush()?.resync == nil)
    }

    @Test func backoffDoublesUpToItsMaximumAndStartsOver() {
        var backoff = Backoff(initial: .milliseconds(100), maximum: .milliseconds(700))
        #expect(
            (0..<5).map { _ in backoff.next() } == [
                .milliseconds(100), .milliseconds(200), .milliseconds(400),
                .milliseconds(700), .milliseconds(700),
            ])
        backoff.reset()
        #expect(backoff.next() == .milliseconds(100))
        #expect(Backoff.milliseconds(.milliseconds(1500)) == 1500)
        let fromTimeAmount = Backoff(initial: NIOCore.TimeAmount.milliseconds(100), maximum: .seconds(5))
        #expect(fromTimeAmount.current == .milliseconds(100) && fromTimeAmount.maximum == .seconds(5))
    }
}

/// A counter the producer task bumps and the test reads.
final class ManagedCounter: Sendable {
    private let count = Mutex(0)
    var value: Int { count.withLock { $0 } }
    func increment() { count.withLock { $0 += 1 } }
}
