import NIOCore
import Synchronization

/// The bounded hand-over between a push feed's reader (CouchDB's continuous feed, Sync Gateway's BLIP connection,
/// Simperium's WebSocket) and the relay, built on swift-nio's `NIOThrowingAsyncSequenceProducer`.
///
/// The reader `yield`s batches as the server pushes them; the relay waits in `next()` for the next one, so nothing
/// polls and a change is handed over the moment it is read. Backpressure: once `capacity` batches wait, `yield`
/// suspends until the relay has taken half of them, so the reader stops reading its socket (and the server, through
/// TCP or its own flow control, stops sending) while the broker is behind; memory stays bounded whatever the backlog.
///
/// One consumer at a time (the relay, or a test): `next()` is never called twice at once. A consumer task that is
/// cancelled ends the stream for good (the source is closed after that anyway). The reader ends it with `finish`:
/// what was yielded is still handed out, then `next()` returns nil, or throws the error it finished with.
public final class ChangeStream: Sendable {
    typealias Producer = NIOThrowingAsyncSequenceProducer<
        ChangeBatch, any Error, NIOAsyncSequenceProducerBackPressureStrategies.HighLowWatermark, Demand
    >

    public let capacity: Int
    private let source: Producer.Source
    /// The sequence's only iterator. Its `next()` does not mutate it (the state sits in the producer's own locked
    /// storage), and only one consumer calls it at a time.
    private nonisolated(unsafe) let iterator: Producer.AsyncIterator
    private let demand: Demand
    /// Changes yielded and not yet handed out (for `lag()`).
    private let waiting = Atomic<Int>(0)

    /// `capacity`: the most batches waiting for the relay before `yield` suspends (at least 1).
    public init(capacity: Int) {
        self.capacity = max(1, capacity)
        let demand = Demand()
        let made = Producer.makeSequence(
            backPressureStrategy: .init(lowWatermark: max(1, self.capacity / 2), highWatermark: self.capacity),
            finishOnDeinit: true, delegate: demand)
        self.demand = demand
        self.source = made.source
        self.iterator = made.sequence.makeAsyncIterator()
    }

    deinit { source.finish() }

    /// Changes yielded and not yet taken by the relay.
    public var bufferedChanges: Int { waiting.load(ordering: .relaxed) }

    // MARK: - Producer

    /// Hands `batch` to the relay; suspends while `capacity` batches wait, until the relay took half of them.
    /// Throws `CancellationError` once the stream is over (finished, or its consumer gone) or when the reading task
    /// is cancelled while it waits: the reader then stops.
    public func yield(_ batch: ChangeBatch) async throws {
        let before = demand.grants
        waiting.add(batch.changes.count, ordering: .relaxed)
        switch source.yield(batch) {
        case .produceMore:
            return
        case .stopProducing:
            try await demand.wait(after: before)
        case .dropped:
            waiting.subtract(batch.changes.count, ordering: .relaxed)
            throw CancellationError()
        }
    }

    /// Ends the stream: the relay takes what was yielded, then `next()` returns nil (or throws `error`).
    public func finish(throwing error: (any Error)? = nil) {
        if let error { source.finish(error) } else { source.finish() }
    }

    // MARK: - Consumer

    /// The next batch, waiting until there is one; nil once the stream is finished (or the calling task is
    /// cancelled).
    public func next() async throws -> ChangeBatch? {
        let batch = try await iterator.next()
        if let batch { waiting.subtract(batch.changes.count, ordering: .relaxed) }
        return batch
    }
}

extension ChangeStream {
    /// The producer's delegate: counts the consumer's calls for more (`produceMore`) and wakes the reader waiting
    /// for one. A yield reads the count before it yields, so a call for more that comes between the yield and the
    /// wait is not missed.
    final class Demand: NIOAsyncSequenceProducerDelegate {
        private struct State {
            var grants: UInt64 = 0
            var terminated = false
            var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
            var lastID: UInt64 = 0
        }

        private let state = Mutex(State())

        var grants: UInt64 { state.withLock { $0.grants } }

        func produceMore() {
            let waiters = state.withLock { state in
                state.grants &+= 1
                defer { state.waiters = [:] }
                return Array(state.waiters.values)
            }
            for waiter in waiters { waiter.resume() }
        }

        func didTerminate() {
            let waiters = state.withLock { state in
                state.terminated = true
                defer { state.waiters = [:] }
                return Array(state.waiters.values)
            }
            for waiter in waiters { waiter.resume() }
        }

        /// Waits until the consumer asked for more after `grants` was `before`; throws `CancellationError` when the
        /// stream terminated or the task is cancelled meanwhile.
        func wait(after before: UInt64) async throws {
            let id = state.withLock { state -> UInt64 in
                state.lastID &+= 1
                return state.lastID
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let waiting = state.withLock { state -> Bool in
                        guard state.grants == before, !state.terminated, !Task.isCancelled else { return false }
                        state.waiters[id] = continuation
                        return true
                    }
                    if !waiting { continuation.resume() }
                }
            } onCancel: {
                state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
            }
            // Woken without a call for more: the stream is over or the reader cancelled.
            if state.withLock({ $0.grants }) == before { throw CancellationError() }
        }
    }
}

/// Collects a push feed's changes into batches of at most `limit` changes, each ending at a position the relay can
/// checkpoint: the reader adds what it parsed and yields the batches it gets back (a full one at once, the rest at
/// the end of what the server sent in one piece). A resync starts a batch of its own, which carries it.
struct BatchCollector: Sendable {
    let limit: Int
    private var changes: [Change] = []
    private var position: String?
    private var resync: Resync?

    init(limit: Int) { self.limit = max(1, limit) }

    var isEmpty: Bool { position == nil && resync == nil }

    /// Adds `change` (nil: only the position moves) ending at `position`; returns the full batch before it, if
    /// the batch in progress had no room left (a full batch waits for positions without a change, such as a feed's
    /// `last_seq`, to join it).
    mutating func add(_ change: Change?, position: String) -> ChangeBatch? {
        var full: ChangeBatch?
        if change != nil, changes.count >= limit { full = flush() }
        if let change { changes.append(change) }
        self.position = position
        return full
    }

    /// Marks the start of a full resync: returns what was collected before it, to be yielded first.
    mutating func startResync(_ resync: Resync) -> ChangeBatch? {
        let before = flush()
        self.resync = resync
        return before
    }

    /// What was collected as a batch (nil when nothing moved the position yet). A resync without a change yet
    /// waits for its first position.
    mutating func flush() -> ChangeBatch? {
        guard let position else { return nil }
        defer {
            changes = []
            self.position = nil
            resync = nil
        }
        return ChangeBatch(changes: changes, position: position, resync: resync)
    }

    /// Forgets the changes collected (a connection lost before the server sent the rest: they are read again); a
    /// resync not yet handed out stays, for the batch that will carry it.
    mutating func reset() {
        changes = []
        position = nil
    }
}
