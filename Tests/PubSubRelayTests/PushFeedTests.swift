import NIOConcurrencyHelpers
import NIOCore
import Testing

@testable import PubSubRelay

/// The runner every push source shares, driven by a scripted connection instead of a server.
@Suite(.timeLimit(.minutes(1))) struct PushFeedTests {
    struct Lost: Error {}
    struct Refused: Error {}

    static func batch(_ position: String) -> ChangeBatch {
        ChangeBatch(
            changes: [Change(collection: ["c"], id: position, operation: .insert, seq: position)],
            position: position)
    }

    @Test func eachConnectionResumesAfterTheLastBatchHandedOverUntilOneStops() async throws {
        let feed = PushFeed(capacity: 8)
        let resumes = NIOLockedValueBox<[String?]>([])
        let pauses = NIOLockedValueBox<[Duration]>([])
        feed.start(
            after: "0", backoff: Backoff(initial: .milliseconds(1), maximum: .milliseconds(4)),
            connect: { resume in
                let attempt = resumes.withLockedValue { resumes -> Int in
                    resumes.append(resume)
                    return resumes.count
                }
                switch attempt {
                case 1:
                    // Two batches, then the connection is lost before the third is complete.
                    try await feed.hand(Self.batch("1"))
                    try await feed.hand(Self.batch("2"))
                    throw Lost()
                case 2, 3:
                    throw Lost()
                case 4:
                    // The server ends this one cleanly after one batch.
                    try await feed.hand(Self.batch("3"))
                default:
                    throw Refused()
                }
            },
            ended: { error, backoff in
                switch error {
                case nil: return .again
                case is Refused: return .stop(RelayError(.sourceFatal, "refused"))
                default:
                    pauses.withLockedValue { $0.append(backoff.current) }
                    return .pause(reset: false)
                }
            })
        var positions: [String] = []
        await #expect(throws: RelayError.self) {
            while let batch = try await feed.next() { positions.append(batch.position) }
        }
        #expect(positions == ["1", "2", "3"])
        #expect(resumes.withLockedValue { $0 } == ["0", "2", "2", "2", "3"])
        // Three failures in a row: the pause doubles each time.
        #expect(pauses.withLockedValue { $0 } == [.milliseconds(1), .milliseconds(2), .milliseconds(4)])
        #expect(feed.connections == 5)
        await feed.close()
    }

    @Test func closingStopsAReaderThatWaitsForTheRelay() async throws {
        let feed = PushFeed(capacity: 2)
        let handed = NIOLockedValueBox(0)
        feed.start(
            after: nil, backoff: Backoff(initial: .milliseconds(1), maximum: .milliseconds(1)),
            connect: { _ in
                for index in 0..<100 {
                    try await feed.hand(Self.batch("\(index)"))
                    handed.withLockedValue { $0 += 1 }
                }
            },
            ended: { _, _ in .again })
        // Nobody takes anything: the reader stops at the stream's capacity.
        let deadline = ContinuousClock.now + .seconds(10)
        while handed.withLockedValue({ $0 }) < 1, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        try await Task.sleep(for: .milliseconds(50))
        #expect(handed.withLockedValue { $0 } == 1)
        await feed.close()
        #expect(try await feed.next()?.position == "0")
        #expect(try await feed.next()?.position == "1")
        #expect(try await feed.next() == nil)
    }
}

extension PushFeedTests {
    /// A connection that ends in `CancellationError` although nobody closed the feed (a library that reports a
    /// closed connection as cancelled): the relay hears of it as an error, after the batches handed over before.
    @Test func aConnectionEndingAsCancelledWithoutACloseEndsTheStreamWithAnError() async throws {
        let feed = PushFeed(capacity: 8)
        feed.start(
            after: nil, backoff: Backoff(initial: .milliseconds(1), maximum: .milliseconds(1)),
            connect: { _ in
                try await feed.hand(Self.batch("1"))
                throw CancellationError()
            },
            ended: { _, _ in .again })
        let ending = Task { () -> (positions: [String], error: (any Error)?) in
            var positions: [String] = []
            do {
                while let batch = try await feed.next() { positions.append(batch.position) }
                return (positions, nil)
            } catch {
                return (positions, error)
            }
        }
        // Before, the reader stopped without a word and `next()` waited for ever.
        let timeout = Task {
            try await Task.sleep(for: .seconds(10))
            ending.cancel()
        }
        let (positions, error) = await ending.value
        timeout.cancel()
        #expect(positions == ["1"])
        #expect((error as? RelayError)?.code == .source)
        await feed.close()
    }
}
