import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

@testable import PubSubRelay

@Suite struct DeadlineTests {
    /// Every query that answers cancels its timer at once: after 300 of them (three seconds of polling at the
    /// default 0.1 s, each with a 30 s deadline) no timer is left waiting, and none expires.
    @Test func aQueryThatAnswersCancelsItsTimer() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let timers = NIOLockedValueBox<[Scheduled<Void>]>([])
        let expired = NIOLockedValueBox(0)
        for i in 0..<300 {
            let answer = try await Deadline.run(
                .seconds(30), on: loop, expire: { expired.withLockedValue { $0 += 1 } },
                scheduled: { timer in timers.withLockedValue { $0.append(timer) } }
            ) { i }
            #expect(answer == i)
        }
        for timer in timers.withLockedValue({ $0 }) {
            // A cancelled timer's future fails with `cancelled` at once; one still waiting would not complete.
            await #expect(throws: EventLoopError.cancelled) { try await timer.futureResult.get() }
        }
        #expect(timers.withLockedValue { $0.count } == 300)
        #expect(expired.withLockedValue { $0 } == 0)
    }

    /// A query that fails also cancels its timer, and its own error is the one thrown.
    @Test func aQueryThatFailsCancelsItsTimerAndKeepsItsError() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let timer = NIOLockedValueBox<Scheduled<Void>?>(nil)
        struct Refused: Error {}
        await #expect(throws: Refused.self) {
            try await Deadline.run(
                .seconds(30), on: loop, expire: {}, scheduled: { t in timer.withLockedValue { $0 = t } }
            ) {
                throw Refused()
            }
        }
        let scheduled = try #require(timer.withLockedValue { $0 })
        await #expect(throws: EventLoopError.cancelled) { try await scheduled.futureResult.get() }
    }

    /// No answer in time: `expire` runs (the source closes the connection there, which ends the query), and the
    /// caller gets `Expired` rather than the query's own error.
    @Test func noAnswerInTimeExpires() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        // The query in flight, or `expired` when the timer came first.
        let waiting = NIOLockedValueBox<(query: CheckedContinuation<Void, any Error>?, expired: Bool)>((nil, false))
        struct Closed: Error {}
        let started = ContinuousClock.now
        await #expect(throws: Deadline.Expired(timeout: .milliseconds(50))) {
            try await Deadline.run(
                .milliseconds(50), on: loop,
                expire: {
                    waiting.withLockedValue {
                        $0.query?.resume(throwing: Closed())
                        $0 = (nil, true)
                    }
                }
            ) {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    waiting.withLockedValue {
                        if $0.expired { continuation.resume(throwing: Closed()) } else { $0.query = continuation }
                    }
                }
            }
        }
        #expect(ContinuousClock.now - started >= .milliseconds(50))
    }
}
