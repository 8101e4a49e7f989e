import NIOConcurrencyHelpers
import Testing

@testable import PubSubRelay

/// The reader of a polled feed (PostgreSQL's slot), driven by scripted polls instead of a server.
@Suite(.timeLimit(.minutes(1))) struct PushFeedPollingTests {
    struct Lost: Error {}

    static func batch(_ position: String) -> ChangeBatch {
        ChangeBatch(
            changes: [Change(collection: ["c"], id: position, operation: .insert, seq: position)],
            position: position)
    }

    static func waitFor(_ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(20)
        while !condition() {
            guard ContinuousClock.now < deadline else { throw Lost() }
            try await Task.sleep(for: .milliseconds(2))
        }
    }

    @Test func acknowledgementsSettleOnceEveryBatchHandedOverIsAcknowledged() {
        var acknowledgements = Acknowledgements()
        #expect(acknowledgements.isSettled)
        acknowledgements.handed()
        acknowledgements.handed()
        #expect(!acknowledgements.isSettled)
        var settled = acknowledgements.acknowledged()
        #expect(!settled)
        settled = acknowledgements.acknowledged()
        #expect(settled)
        // One more than was handed over changes nothing: the next batch handed is still waited for.
        settled = acknowledgements.acknowledged()
        #expect(settled)
        acknowledgements.handed()
        #expect(!acknowledgements.isSettled)
        #expect(acknowledgements == Acknowledgements.counted(handed: 3, acknowledged: 2))
    }

    @Test func aFullPollIsFollowedAtOnceAndADrainedOneAfterTheInterval() {
        #expect(PushFeed.Poll.full.rest(.seconds(1)) == nil)
        #expect(PushFeed.Poll.drained.rest(.seconds(1)) == .seconds(1))
    }

    @Test func theNextPollWaitsUntilTheRelayAcknowledgedEveryBatchOfTheLastOne() async throws {
        let feed = PushFeed(capacity: 8)
        let journal = Journal()
        let polls = NIOLockedValueBox(0)
        feed.startPolling(
            after: nil, backoff: Backoff(initial: .milliseconds(1), maximum: .milliseconds(1)),
            // An interval of an hour: a poll after a drained one would not come within the test.
            interval: .seconds(3600),
            open: { _ in journal.record("open") },
            poll: {
                let poll = polls.withLockedValue { count -> Int in
                    count += 1
                    return count
                }
                journal.record("poll \(poll) settled \(feed.isSettled)")
                switch poll {
                case 1:
                    try await feed.hand(Self.batch("1"))
                    try await feed.hand(Self.batch("2"))
                    return .full
                default:
                    try await feed.hand(Self.batch("3"))
                    return .drained
                }
            },
            ended: { _, _ in .pause(reset: false) })
        for position in ["1", "2", "3"] {
            let batch = try #require(try await feed.next())
            #expect(batch.position == position)
            journal.record("acknowledge \(position)")
            feed.acknowledge()
        }
        try await Self.waitFor { feed.isSettled }
        await feed.close()
        // The second poll came at once after the full first one, but only once both its batches were acknowledged.
        #expect(
            journal.events == [
                "open", "poll 1 settled true", "acknowledge 1", "acknowledge 2", "poll 2 settled true", "acknowledge 3",
            ])
        #expect(polls.withLockedValue { $0 } == 2)
    }

    @Test func aDrainedPollRestsTheIntervalBeforeTheNext() async throws {
        let feed = PushFeed(capacity: 8)
        let starts = NIOLockedValueBox<[ContinuousClock.Instant]>([])
        let ends = NIOLockedValueBox<[ContinuousClock.Instant]>([])
        feed.startPolling(
            after: nil, backoff: Backoff(initial: .milliseconds(1), maximum: .milliseconds(1)),
            interval: .milliseconds(300),
            open: { _ in },
            poll: {
                let count = starts.withLockedValue { starts -> Int in
                    starts.append(.now)
                    return starts.count
                }
                defer { ends.withLockedValue { $0.append(.now) } }
                return count == 1 ? .full : .drained
            },
            ended: { _, _ in .pause(reset: false) })
        try await Self.waitFor { starts.withLockedValue { $0.count } >= 3 }
        await feed.close()
        let (started, ended) = (starts.withLockedValue { $0 }, ends.withLockedValue { $0 })
        // After the drained second poll, the third waited the interval.
        #expect(started[2] - ended[1] >= .milliseconds(300))
    }

    @Test func aLostConnectionReopensAfterTheBatchesHandedOverAreAcknowledged() async throws {
        let feed = PushFeed(capacity: 8)
        let journal = Journal()
        let opens = NIOLockedValueBox(0)
        feed.startPolling(
            after: "0", backoff: Backoff(initial: .milliseconds(1), maximum: .milliseconds(1)),
            interval: .seconds(3600),
            open: { resume in
                let count = opens.withLockedValue { count -> Int in
                    count += 1
                    return count
                }
                journal.record("open \(count) after \(resume ?? "nil") settled \(feed.isSettled)")
                if count == 2 { throw Lost() }
            },
            poll: {
                let count = opens.withLockedValue { $0 }
                try await feed.hand(Self.batch("\(count)"))
                if count == 1 { throw Lost() }
                return .drained
            },
            ended: { error, _ in
                journal.record("ended")
                return error == nil ? .again : .pause(reset: false)
            })
        for position in ["1", "3"] {
            let batch = try #require(try await feed.next())
            #expect(batch.position == position)
            journal.record("acknowledge \(position)")
            feed.acknowledge()
        }
        await feed.close()
        let events = journal.events
        // Each new connection came once the batch of the lost one was acknowledged, and resumed after it.
        #expect(
            events.filter { $0.hasPrefix("open") } == [
                "open 1 after 0 settled true", "open 2 after 1 settled true", "open 3 after 1 settled true",
            ])
        #expect(events.firstIndex(of: "acknowledge 1")! < events.firstIndex(of: "open 2 after 1 settled true")!)
        #expect(events.filter { $0 == "ended" }.count == 2)
    }
}

extension Acknowledgements {
    static func counted(handed: Int, acknowledged: Int) -> Acknowledgements {
        var counted = Acknowledgements()
        for _ in 0..<handed { counted.handed() }
        for _ in 0..<acknowledged { _ = counted.acknowledged() }
        return counted
    }
}
