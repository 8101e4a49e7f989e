import NIOCore
import Synchronization

/// A deadline on one operation (a query, a read of rows): a timer on an event loop that calls `expire` once
/// `timeout` passed without an answer, and that is cancelled the moment the operation answers, so that nothing is
/// left waiting per query. The operation runs in the caller's own task and isolation (no task is started):
/// `expire` must make it end (close the connection its query waits on), after which `run` throws `Expired`.
public enum Deadline {
    /// The operation did not answer within `timeout`.
    public struct Expired: Error, Sendable, Equatable {
        public var timeout: TimeAmount
    }

    /// Runs `body`; `scheduled` sees the timer (tests check it is cancelled).
    public static func run<T>(
        _ timeout: TimeAmount, on eventLoop: any EventLoop, isolation: isolated (any Actor)? = #isolation,
        expire: @escaping @Sendable () -> Void, scheduled: ((Scheduled<Void>) -> Void)? = nil,
        _ body: () async throws -> T
    ) async throws -> T {
        let flag = ExpiredFlag()
        let timer = eventLoop.scheduleTask(in: timeout) {
            flag.set()
            expire()
        }
        scheduled?(timer)
        let result: Result<T, any Error>
        do {
            result = .success(try await body())
        } catch {
            result = .failure(error)
        }
        timer.cancel()
        if flag.isSet { throw Expired(timeout: timeout) }
        return try result.get()
    }
}

/// Set once by the timer, read by the caller after the operation answered.
private final class ExpiredFlag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}
