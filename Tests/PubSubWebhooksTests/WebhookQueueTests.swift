import NIOCore
import Testing

@testable import PubSubWebhooks

@Suite struct WebhookQueueTests {
    let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)

    func settings(capacity: Int = 1000, maxBatch: Int = 100, maxAttempts: Int = 4) -> WebhookQueueSettings {
        WebhookQueueSettings(
            capacity: capacity, maxBatch: maxBatch, maxDelay: .seconds(1), maxAttempts: maxAttempts,
            initialBackoff: .milliseconds(500), maxBackoff: .seconds(3))
    }

    @Test func emptyQueueIsIdle() {
        var queue = WebhookQueue<Int>(settings: settings())
        guard case .idle = queue.next(now: t0) else {
            Issue.record("not idle")
            return
        }
    }

    @Test func aBatchWaitsForItsDelayUnlessFull() {
        var queue = WebhookQueue<Int>(settings: settings(maxBatch: 3))
        do {
            let r = queue.append(1, now: t0)
            #expect(r)
        }
        do {
            let r = queue.append(2, now: t0 + .milliseconds(400))
            #expect(r)
        }
        guard case .wait(let until) = queue.next(now: t0 + .milliseconds(500)) else {
            Issue.record("sent before the delay")
            return
        }
        #expect(until == t0 + .seconds(1))
        guard case .send(let batch, let attempt) = queue.next(now: t0 + .seconds(1)) else {
            Issue.record("not sent at the delay")
            return
        }
        #expect(batch == [1, 2])
        #expect(attempt == 1)
        queue.succeeded()
        for i in 3...5 {
            do {
                let r = queue.append(i, now: t0 + .seconds(2))
                #expect(r)
            }
        }
        guard case .send(let full, _) = queue.next(now: t0 + .seconds(2)) else {
            Issue.record("a full batch waited")
            return
        }
        #expect(full == [3, 4, 5])
    }

    @Test func batchesHoldAtMostMaxBatchInOrder() {
        var queue = WebhookQueue<Int>(settings: settings(maxBatch: 100))
        for i in 0..<250 {
            do {
                let r = queue.append(i, now: t0)
                #expect(r)
            }
        }
        var sent: [[Int]] = []
        while case .send(let batch, _) = queue.next(now: t0) {
            sent.append(batch)
            queue.succeeded()
        }
        #expect(sent.map(\.count) == [100, 100])
        // The remaining 50 wait for their delay.
        guard case .send(let last, _) = queue.next(now: t0 + .seconds(1)) else {
            Issue.record("remainder not sent")
            return
        }
        #expect(sent.joined() + last == Array(0..<250))
    }

    @Test func failuresAreRetriedWithDoublingBackoffThenGivenUp() {
        var queue = WebhookQueue<Int>(settings: settings(maxAttempts: 4))
        do {
            let r = queue.append(7, now: t0)
            #expect(r)
        }
        var now = t0 + .seconds(1)
        guard case .send(_, 1) = queue.next(now: now) else {
            Issue.record("first send")
            return
        }
        var waits: [TimeAmount] = []
        for expectedAttempt in 2...4 {
            do {
                let r = queue.failed(now: now)
                #expect(r == 0)
            }
            guard case .wait(let until) = queue.next(now: now) else {
                Issue.record("no backoff")
                return
            }
            waits.append(until - now)
            now = until
            guard case .send(let batch, let attempt) = queue.next(now: now) else {
                Issue.record("no retry")
                return
            }
            #expect(batch == [7])
            #expect(attempt == expectedAttempt)
        }
        #expect(waits == [.milliseconds(500), .seconds(1), .seconds(2)])
        do {
            let r = queue.failed(now: now)
            #expect(r == 1)
        }
        #expect(queue.droppedFailed == 1)
        #expect(queue.isEmpty)
        guard case .idle = queue.next(now: now) else {
            Issue.record("not idle after giving up")
            return
        }
    }

    @Test func backoffIsCapped() {
        let s = settings()
        #expect(s.backoff(afterAttempt: 1) == .milliseconds(500))
        #expect(s.backoff(afterAttempt: 3) == .seconds(2))
        #expect(s.backoff(afterAttempt: 4) == .seconds(3))
        #expect(s.backoff(afterAttempt: 100) == .seconds(3))
    }

    @Test func theBoundCountsEventsInFlightAndDropsTheNewest() {
        var queue = WebhookQueue<Int>(settings: settings(capacity: 3, maxBatch: 2))
        for i in 0..<3 {
            do {
                let r = queue.append(i, now: t0)
                #expect(r)
            }
        }
        guard case .send(let batch, _) = queue.next(now: t0) else {
            Issue.record("no send")
            return
        }
        #expect(batch == [0, 1])
        // Two in flight and one pending: full.
        do {
            let r = queue.append(3, now: t0)
            #expect(!r)
        }
        do {
            let r = queue.append(4, now: t0)
            #expect(!r)
        }
        #expect(queue.droppedFull == 2)
        queue.succeeded()
        do {
            let r = queue.append(5, now: t0)
            #expect(r)
        }
        guard case .send(let next, _) = queue.next(now: t0) else {
            Issue.record("no send")
            return
        }
        #expect(next == [2, 5])
    }

    @Test func flushingSendsAtOnceAndDoesNotRetry() {
        var queue = WebhookQueue<Int>(settings: settings())
        do {
            let r = queue.append(1, now: t0)
            #expect(r)
        }
        queue.flush()
        guard case .send(let batch, _) = queue.next(now: t0) else {
            Issue.record("flush waited")
            return
        }
        #expect(batch == [1])
        do {
            let r = queue.failed(now: t0)
            #expect(r == 1)
        }
        #expect(queue.isEmpty)
        do {
            let r = queue.append(2, now: t0)
            #expect(r)
        }
        do {
            let r = queue.dropAll()
            #expect(r == 1)
        }
        #expect(queue.droppedFailed == 2)
    }
}
