import NIOCore

/// Which resident sessions a connect may serve without asking Redis, and the batches that replace the question.
///
/// A connect on a session's home node used to run the `touch` script: refresh its expiry, check that no other node
/// holds it. Every change of a session's home or existence in Redis is also told to its home node, in order, on the
/// notification channel (`M` when another node claims it, `D` when it ends), so once Redis has confirmed a session
/// here (a `touch` or `claim` that refreshed it), the node's own view stays true for as long as that channel is not
/// cut. A connect for such a session only has to make sure that every notification published before it arrived has
/// been read (a claim by another node that the client made just before, whose `M` is still on its way: the race the
/// `touch` answer "another node holds it" caught). One barrier, published on the node's own channel, does that for
/// every connect that came in meanwhile, and the expiries of those sessions are refreshed in the same write, one
/// `ZADD XX` for many ids, before the barrier: a connect is answered only after its refresh is in Redis.
///
/// At most one batch is in flight; connects arriving meanwhile wait for the next one, sent when it settles. A cut of
/// either Redis connection (`reset`) forgets every confirmation (a notification may have been lost) and hands the
/// waiting connects back, to take the `touch` path. `Waiter` is whatever the engine resumes (a promise); a plain
/// value in tests. Time is an input; nothing here touches a socket.
struct ResidencyLedger<Waiter> {
    /// One write: the expiries to refresh (id → milliseconds since the Unix epoch), then the barrier `barrier`.
    struct Batch: Equatable {
        var barrier: UInt64
        var refreshes: [(id: String, expiry: Int64)]

        static func == (a: Batch, b: Batch) -> Bool {
            a.barrier == b.barrier
                && a.refreshes.elementsEqual(b.refreshes) { $0.id == $1.id && $0.expiry == $1.expiry }
        }
    }

    enum Decision {
        /// Redis must answer (the session is not confirmed here): run the `touch` script.
        case touch
        /// Wait for the next batch's barrier; send `batch` now if one is given.
        case wait(send: Batch?)
    }

    private struct Entry {
        /// When Redis last had this session's expiry refreshed by this node (a confirmation or a batch).
        var refreshed: NIODeadline
    }

    /// Sessions confirmed here since the last reset.
    private var entries: [String: Entry] = [:]
    /// Counts resets, so that a confirmation asked for before a cut and answered after it is ignored.
    private(set) var generation: UInt64 = 0
    /// The next batch: its refreshes and waiters.
    private var pendingRefreshes: [String: Int64] = [:]
    private var pendingWaiters: [Waiter] = []
    /// The batch in flight (its barrier number and waiters).
    private var inFlight: (barrier: UInt64, waiters: [Waiter])?
    private var lastBarrier: UInt64 = 0
    private var nextPrune: NIODeadline?

    /// How long a session stays confirmed without a connect (its Redis lifetime: an entry older than that is for a
    /// session gone or expired, and is dropped).
    let lifetime: TimeAmount
    /// Most confirmed sessions kept (beyond it, new confirmations are not kept and those sessions keep touching).
    let capacity: Int

    init(lifetime: TimeAmount, capacity: Int = 1_000_000) {
        self.lifetime = lifetime
        self.capacity = capacity
    }

    var confirmedCount: Int { entries.count }
    var waiting: Int { pendingWaiters.count + (inFlight?.waiters.count ?? 0) }

    /// Redis confirmed (a `touch` or `claim` with refresh, asked in `generation`) that the session lives here with
    /// an expiry from `now`.
    mutating func confirmed(_ id: String, now: NIODeadline, generation: UInt64) {
        guard generation == self.generation else { return }
        if entries[id] == nil, entries.count >= capacity { return }
        entries[id] = Entry(refreshed: now)
    }

    /// The session left this node (moved, ended): its next connect here asks Redis.
    mutating func forget(_ id: String) {
        entries[id] = nil
        pendingRefreshes[id] = nil
    }

    /// A connect at `now` for a session resident here, whose expiry would become `expiry` (ms).
    mutating func connect(_ id: String, now: NIODeadline, expiry: Int64, waiter: Waiter) -> Decision {
        guard entries[id] != nil else { return .touch }
        entries[id] = Entry(refreshed: now)
        pendingRefreshes[id] = expiry
        pendingWaiters.append(waiter)
        return .wait(send: inFlight == nil ? startBatch() : nil)
    }

    /// The barrier of the batch in flight came back: its waiters go on; the next batch, if any, is to be sent.
    mutating func settled(_ barrier: UInt64) -> (waiters: [Waiter], send: Batch?) {
        guard let batch = inFlight, batch.barrier == barrier else { return ([], nil) }
        inFlight = nil
        return (batch.waiters, pendingWaiters.isEmpty ? nil : startBatch())
    }

    /// A cut (or a batch that could not be sent): every confirmation is forgotten, and the waiting connects are
    /// handed back to ask Redis themselves.
    mutating func reset() -> [Waiter] {
        generation &+= 1
        entries = [:]
        pendingRefreshes = [:]
        let waiters = (inFlight?.waiters ?? []) + pendingWaiters
        inFlight = nil
        pendingWaiters = []
        return waiters
    }

    /// Drops the entries of sessions without a connect for `lifetime` (at most once per quarter lifetime).
    mutating func prune(now: NIODeadline) {
        if let nextPrune, now < nextPrune { return }
        nextPrune = now + .nanoseconds(max(1, lifetime.nanoseconds / 4))
        let oldest = now - lifetime
        entries = entries.filter { $0.value.refreshed >= oldest }
    }

    private mutating func startBatch() -> Batch {
        lastBarrier += 1
        let batch = Batch(barrier: lastBarrier, refreshes: pendingRefreshes.map { ($0.key, $0.value) })
        inFlight = (lastBarrier, pendingWaiters)
        pendingWaiters = []
        pendingRefreshes = [:]
        return batch
    }
}

extension ResidencyLedger: Sendable where Waiter: Sendable {}
