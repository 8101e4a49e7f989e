import Logging
import NIOCore
import PostgresNIO

extension PostgresConnection {
    /// `query(_:logger:)`, but failed once the connection closes before PostgreSQL answered.
    ///
    /// postgres-nio writes a query into the channel without a write promise. Once the channel closed, its handlers
    /// leave the pipeline, and a query written after that is dropped: neither its answer nor an error ever comes.
    /// The window is short but real: a terminated backend (or our own `close()`) between the reader's look at
    /// `isClosed` and the write. Under load it left the reader waiting for ever, past its deadline (which closes
    /// the connection, and a dropped query does not hear that), without a line in the log.
    @discardableResult
    func answer(_ query: PostgresQuery, logger: Logger) async throws -> PostgresRowSequence {
        try await UnlessClosed.run(closeFuture) { try await self.query(query, logger: logger) }
    }
}

/// Waits for an operation on a connection or for the connection's close, whichever comes first.
enum UnlessClosed {
    /// The connection closed before the operation answered.
    struct Closed: Error, CustomStringConvertible {
        var description: String { "the connection closed before the server answered" }
    }

    /// The result of `operation`, or `Closed` once `closeFuture` completed before it. An operation that never ends
    /// is left behind: a suspended task holding a dropped query, nothing more.
    static func run<T: Sendable>(
        _ closeFuture: EventLoopFuture<Void>, _ operation: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        let answer = closeFuture.eventLoop.makePromise(of: T.self)
        answer.completeWithTask(operation)
        // The second completion of the promise is ignored: the first of the two wins.
        closeFuture.whenComplete { _ in answer.fail(Closed()) }
        return try await answer.futureResult.get()
    }
}
