import Synchronization

/// What every feed shares (CouchDB's `_changes`, Sync Gateway's BLIP, Simperium, and PostgreSQL's slot, which is
/// polled: see `startPolling`): the reader task that keeps a connection open, the pause between connections, the
/// position a new connection resumes from, and the stream through which batches reach the relay. A source brings
/// only its protocol: one connection (`connect`), which hands batches over with `hand` as it reads them, and what the
/// end of a connection means (`ended`), which it logs in its own words.
///
/// A new connection resumes after the last batch handed over: what the stream holds is relayed anyway, and what the
/// lost connection read but had not handed over is read again. A relay restarted (or killed) starts a new source
/// from its checkpoint instead, so every change is relayed at least once and none is skipped.
final class PushFeed: Sendable {
    /// What the source makes of the end of a connection.
    enum Next: Sendable {
        /// Connect again at once, starting the backoff over (the feed moved on: a page read, a long poll answered,
        /// a position the server refused and the feed starts over from).
        case again
        /// Connect again after the backoff's pause; `reset` starts the backoff over first (the connection carried
        /// traffic, so the server is not failing over and over).
        case pause(reset: Bool)
        /// The feed cannot go on (a refused token): the relay gets `error` after the batches handed over before it.
        case stop(any Error)
    }

    private struct State {
        var resume: String?
        var reader: Task<Void, Never>?
        var connections = 0
        /// Batches handed over, and how many of them the relay acknowledged (`acknowledge()`).
        var acknowledgements = Acknowledgements()
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var lastWaiter: UInt64 = 0
    }

    let stream: ChangeStream
    private let state = Mutex(State())

    /// `capacity`: the most batches waiting for the relay (see `ChangeStream`).
    init(capacity: Int) {
        stream = ChangeStream(capacity: capacity)
    }

    /// Where the next connection resumes: the position of the last batch handed over, or what `resume(from:)` set.
    var resume: String? { state.withLock { $0.resume } }

    /// Connections opened so far (for tests and logs).
    var connections: Int { state.withLock { $0.connections } }

    /// Makes the next connection resume from `position` (a resync starting over from the feed's beginning).
    func resume(from position: String?) {
        state.withLock { $0.resume = position }
    }

    /// Starts the reader after `position`: `connect` is called with the position to resume from, again and again,
    /// until `close()` or `.stop`; after each connection `ended` hears how it ended (nil: the server ended it
    /// cleanly) and the backoff its pause would come from, and says what comes next.
    func start(
        after position: String?, backoff: Backoff,
        connect: @escaping @Sendable (_ resume: String?) async throws -> Void,
        ended: @escaping @Sendable (_ error: (any Error)?, _ backoff: Backoff) async -> Next
    ) {
        state.withLock { state in
            guard state.reader == nil else { return }
            state.resume = position
            state.reader = Task { await self.run(backoff: backoff, connect: connect, ended: ended) }
        }
    }

    private func run(
        backoff: Backoff, connect: @Sendable (String?) async throws -> Void,
        ended: @Sendable ((any Error)?, Backoff) async -> Next
    ) async {
        var backoff = backoff
        while !Task.isCancelled {
            let resume = state.withLock { state -> String? in
                state.connections += 1
                return state.resume
            }
            var failure: (any Error)?
            do {
                try await connect(resume)
            } catch {
                failure = error
            }
            // Closed: `close()` ends the stream.
            if Task.isCancelled { return }
            if failure is CancellationError {
                // Not closed, yet the connection ended as cancelled: the relay is gone (the stream refused a batch,
                // and finishing it changes nothing), or something under the connection gave up. The relay must
                // hear of it, so that its runner logs it and starts over; else it waits for batches that never come.
                stream.finish(throwing: RelayError(.source, "the connection to the source ended as cancelled"))
                return
            }
            switch await ended(failure, backoff) {
            case .again:
                backoff.reset()
            case .pause(let reset):
                if reset { backoff.reset() }
                do { try await backoff.wait() } catch { return }
            case .stop(let error):
                stream.finish(throwing: error)
                return
            }
        }
    }

    /// Hands `batch` (if any) to the relay, waiting while the relay is behind, and makes its position the one a new
    /// connection resumes from. Throws `CancellationError` once the relay is gone.
    func hand(_ batch: ChangeBatch?) async throws {
        guard let batch else { return }
        state.withLock { state in
            state.resume = batch.position
            state.acknowledgements.handed()
        }
        try await stream.yield(batch)
    }

    /// The relay acknowledged the oldest batch not yet acknowledged (published, checkpointed: the source's
    /// `confirm`). A polled feed waits for these before it polls again (`settled()`).
    func acknowledge() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            guard state.acknowledgements.acknowledged() else { return [] }
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Whether every batch handed over was acknowledged.
    var isSettled: Bool { state.withLock { $0.acknowledgements.isSettled } }

    /// Waits until the relay acknowledged every batch handed over; throws `CancellationError` when the task is
    /// cancelled meanwhile.
    func settled() async throws {
        let id = state.withLock { state -> UInt64 in
            state.lastWaiter &+= 1
            return state.lastWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let waiting = state.withLock { state -> Bool in
                    guard !state.acknowledgements.isSettled, !Task.isCancelled else { return false }
                    state.waiters[id] = continuation
                    return true
                }
                if !waiting { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
        try Task.checkCancellation()
    }

    /// The next batch handed over, waiting for it; nil once closed.
    func next() async throws -> ChangeBatch? {
        try await stream.next()
    }

    /// Tells the reader to stop, without waiting for it (a source that must also end its connection first).
    func cancel() {
        state.withLock { $0.reader }?.cancel()
    }

    /// Stops the reader (its connection ends with it), waits for it, and ends the stream.
    func close() async {
        let reader = state.withLock { state -> Task<Void, Never>? in
            defer { state.reader = nil }
            return state.reader
        }
        reader?.cancel()
        await reader?.value
        stream.finish()
    }
}
