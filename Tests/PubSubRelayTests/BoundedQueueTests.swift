import Testing

@testable import PubSubRelay

@Suite struct BoundedQueueTests {
    struct Item: Sendable, Equatable {
        var name: String
        var startsBatch = false
    }

    @Test func aFullQueueHoldsTheProducerBack() async throws {
        let queue = BoundedQueue<String>(capacity: 2)
        try await queue.push("a")
        try await queue.push("b")
        let third = Task { try await queue.push("c") }
        try await Task.sleep(for: .milliseconds(100))
        #expect(queue.count == 2, "the third element waits for room")
        #expect(await queue.take(max: 10, timeout: .milliseconds(10)) == ["a", "b"])
        #expect(try await third.value)
        #expect(await queue.take(max: 10, timeout: .milliseconds(10)) == ["c"])
    }

    @Test func takeWaitsBrieflyThenReturnsNothing() async throws {
        let queue = BoundedQueue<String>(capacity: 2)
        let start = ContinuousClock.now
        #expect(await queue.take(max: 10, timeout: .milliseconds(50)).isEmpty)
        #expect(await queue.pop(timeout: .milliseconds(50)) == nil)
        let waited = ContinuousClock.now - start
        // The upper bound only catches a hang: a busy machine may run the timers late.
        #expect(waited >= .milliseconds(100) && waited < .seconds(60))
        let late = Task {
            try await Task.sleep(for: .milliseconds(30))
            try await queue.push("late")
        }
        #expect(await queue.take(max: 10, timeout: .seconds(60)) == ["late"])
        try await late.value
    }

    @Test func takeHandsOutAtMostMaxAndStartsABatchWhereAsked() async throws {
        let queue = BoundedQueue<Item>(capacity: 5)
        for item in [Item(name: "a"), Item(name: "b", startsBatch: true), Item(name: "c"), Item(name: "d"), Item(name: "e")] {
            try await queue.push(item)
        }
        let take = { await queue.take(max: 2, timeout: .zero, startsBatch: \.startsBatch).map(\.name) }
        #expect(await take() == ["a"])
        #expect(await take() == ["b", "c"])
        #expect(await take() == ["d", "e"])
        #expect(await take() == [])
    }

    @Test func anExtractingTakeWaitsUntilWhatItNeedsIsThere() async throws {
        // Takes a run of elements only once a "." ends it, as a feed hands out changes only with a position.
        let queue = BoundedQueue<String>(capacity: 10)
        try await queue.push("x")
        let producer = Task {
            try await Task.sleep(for: .milliseconds(50))
            try await queue.push("y")
            try await Task.sleep(for: .milliseconds(50))
            try await queue.push(".")
            try await queue.push("z")
        }
        let run = await queue.take(timeout: .seconds(60)) { queued -> (count: Int, result: [String])? in
            guard let end = queued.firstIndex(of: ".") else { return nil }
            return (end - queued.startIndex + 1, Array(queued[..<end]))
        }
        #expect(run == ["x", "y"])
        try await producer.value
        #expect(queue.tryPop() == "z")
        #expect(queue.tryPop() == nil)
    }

    @Test func aBlockedProducerCanBeCancelledAndClearMakesRoom() async throws {
        let queue = BoundedQueue<String>(capacity: 3)
        for name in ["x", "y", "z"] { try await queue.push(name) }
        let cancelled = Task { try await queue.push("w") }
        try await Task.sleep(for: .milliseconds(50))
        cancelled.cancel()
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        #expect(queue.count == 3)

        let blocked = Task { try await queue.push("v") }
        try await Task.sleep(for: .milliseconds(50))
        queue.clear()
        #expect(try await blocked.value)
        #expect(await queue.take(max: 10, timeout: .seconds(5)) == ["v"])
    }

    @Test func closingWakesEverybody() async throws {
        let queue = BoundedQueue<String>(capacity: 1)
        let consumer = Task { await queue.pop(timeout: .seconds(30)) }
        try await Task.sleep(for: .milliseconds(50))
        try await queue.push("a")
        #expect(await consumer.value == "a")
        try await queue.push("b")
        let producer = Task { try await queue.push("c") }
        let waiting = Task {
            await queue.take(timeout: .seconds(30)) { _ -> (count: Int, result: Int)? in nil }
        }
        try await Task.sleep(for: .milliseconds(50))
        let start = ContinuousClock.now
        queue.close()
        #expect(try await producer.value == false, "a push after closing is dropped")
        #expect(await waiting.value == nil)
        #expect(ContinuousClock.now - start < .seconds(5))
        #expect(queue.tryPop() == "b", "what was queued can still be taken")
        #expect(await queue.pop(timeout: .seconds(30)) == nil)
    }

    @Test func aCancelledConsumerStopsWaiting() async throws {
        let queue = BoundedQueue<String>(capacity: 1)
        let consumer = Task { await queue.pop(timeout: .seconds(30)) }
        try await Task.sleep(for: .milliseconds(50))
        let start = ContinuousClock.now
        consumer.cancel()
        #expect(await consumer.value == nil)
        #expect(ContinuousClock.now - start < .seconds(5))
    }
}
