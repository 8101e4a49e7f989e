import NIOCore
import NIOPosix
import Testing

@testable import PubSubRelay

/// A query on a connection that closed under it (postgres-nio then drops the query): the wait ends with the close.
@Suite(.timeLimit(.minutes(1))) struct UnlessClosedTests {
    @Test func anOperationThatNeverAnswersEndsWhenTheConnectionCloses() async throws {
        let eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        let closed = eventLoop.makePromise(of: Void.self)
        // A query that was dropped: its answer comes only when the test gives it, after the close.
        let dropped = eventLoop.makePromise(of: Int.self)
        let waiting = Task {
            try await UnlessClosed.run(closed.futureResult) { try await dropped.futureResult.get() }
        }
        try await Task.sleep(for: .milliseconds(20))
        closed.succeed(())
        await #expect(throws: UnlessClosed.Closed.self) { try await waiting.value }
        // An answer after the close changes nothing.
        dropped.succeed(1)
    }

    @Test func anAnswerBeforeTheCloseIsReturned() async throws {
        let eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        let closed = eventLoop.makePromise(of: Void.self)
        #expect(try await UnlessClosed.run(closed.futureResult) { 7 } == 7)
        closed.succeed(())
        // A connection closed already: the wait ends at once.
        let dropped = eventLoop.makePromise(of: Int.self)
        await #expect(throws: UnlessClosed.Closed.self) {
            try await UnlessClosed.run(closed.futureResult) { try await dropped.futureResult.get() }
        }
        dropped.succeed(1)
    }
}
