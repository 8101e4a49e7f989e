import NIOCore

/// The outbound queue of one webhook endpoint as a plain state machine: events go in with the time they came,
/// batches come out (at most `maxBatch` events, or whatever waited `maxDelay`), a failed batch is retried with
/// exponential backoff up to `maxAttempts`, and events beyond `capacity` are refused (counted, not queued).
/// No clock of its own: every call takes `now`, so tests drive it without sleeping.
struct WebhookQueue<Element> {
    enum Action {
        /// Nothing is waiting.
        case idle
        /// Ask again at this time (a batch that is not full yet, or a retry's backoff).
        case wait(until: NIODeadline)
        /// Post these events; answer with `succeeded` or `failed`. `attempt` counts from 1.
        case send([Element], attempt: Int)
    }

    let settings: WebhookQueueSettings
    private var pending = CircularBuffer<(element: Element, at: NIODeadline)>()
    /// The batch being posted or waiting for its retry.
    private var inFlight: [Element]?
    private var attempt = 0
    private var retryAt: NIODeadline?
    /// Set when the broker drains: everything pending goes at once, without waiting for a batch to fill.
    private(set) var flushing = false

    /// Events refused because the queue was full.
    private(set) var droppedFull: UInt64 = 0
    /// Events given up after `maxAttempts` failed posts.
    private(set) var droppedFailed: UInt64 = 0

    init(settings: WebhookQueueSettings) {
        self.settings = settings
    }

    /// Events held: pending and in flight.
    var count: Int { pending.count + (inFlight?.count ?? 0) }

    var isEmpty: Bool { count == 0 }

    /// Whether a full batch waits to be taken: a sender waiting for a batch's delay can go at once.
    var hasFullBatch: Bool { inFlight == nil && pending.count >= settings.maxBatch }

    /// Queues an event; false (and counted) when the queue is full.
    mutating func append(_ element: Element, now: NIODeadline) -> Bool {
        guard count < settings.capacity else {
            droppedFull += 1
            return false
        }
        pending.append((element, now))
        return true
    }

    mutating func flush() { flushing = true }

    /// Gives up everything held (the drain ran out of time); returns how many events that was.
    mutating func dropAll() -> Int {
        let n = count
        droppedFailed += UInt64(n)
        pending.removeAll()
        succeeded()
        return n
    }

    mutating func next(now: NIODeadline) -> Action {
        if let batch = inFlight {
            if let retryAt, retryAt > now { return .wait(until: retryAt) }
            retryAt = nil
            return .send(batch, attempt: attempt)
        }
        guard let oldest = pending.first else { return .idle }
        let due = oldest.at + settings.maxDelay
        guard flushing || pending.count >= settings.maxBatch || due <= now else { return .wait(until: due) }
        let size = min(settings.maxBatch, pending.count)
        var batch: [Element] = []
        batch.reserveCapacity(size)
        for _ in 0..<size { batch.append(pending.removeFirst().element) }
        inFlight = batch
        attempt = 1
        return .send(batch, attempt: 1)
    }

    /// The batch in flight was accepted.
    mutating func succeeded() {
        inFlight = nil
        attempt = 0
        retryAt = nil
    }

    /// The batch in flight failed: it is retried after a backoff, or dropped after `maxAttempts`. Returns how many
    /// events were dropped (0 when it will be retried).
    @discardableResult
    mutating func failed(now: NIODeadline) -> Int {
        guard let batch = inFlight else { return 0 }
        if attempt >= settings.maxAttempts || flushing {
            droppedFailed += UInt64(batch.count)
            succeeded()
            return batch.count
        }
        retryAt = now + settings.backoff(afterAttempt: attempt)
        attempt += 1
        return 0
    }
}

/// The bounds of a webhook queue; every value has a default.
public struct WebhookQueueSettings: Sendable, Equatable {
    /// Events held per endpoint (pending and in flight); more are dropped and counted.
    public var capacity: Int
    /// Events per POST, at most.
    public var maxBatch: Int
    /// How long the first event of a batch waits for others before the batch is sent.
    public var maxDelay: TimeAmount
    /// Posts of one batch before it is given up (the first one included).
    public var maxAttempts: Int
    /// The wait after the first failure; doubled after each further one, up to `maxBackoff`.
    public var initialBackoff: TimeAmount
    public var maxBackoff: TimeAmount

    public init(
        capacity: Int = 10_000,
        maxBatch: Int = 100,
        maxDelay: TimeAmount = .seconds(1),
        maxAttempts: Int = 8,
        initialBackoff: TimeAmount = .milliseconds(500),
        maxBackoff: TimeAmount = .seconds(30)
    ) {
        self.capacity = capacity
        self.maxBatch = maxBatch
        self.maxDelay = maxDelay
        self.maxAttempts = maxAttempts
        self.initialBackoff = initialBackoff
        self.maxBackoff = maxBackoff
    }

    /// The wait after failed attempt `attempt` (1-based): initial, 2×, 4×… capped.
    public func backoff(afterAttempt attempt: Int) -> TimeAmount {
        let shift = min(max(attempt - 1, 0), 30)
        let nanoseconds = initialBackoff.nanoseconds.multipliedReportingOverflow(by: Int64(1) << shift)
        if nanoseconds.overflow { return maxBackoff }
        return .nanoseconds(min(nanoseconds.partialValue, maxBackoff.nanoseconds))
    }
}

extension WebhookQueue: Sendable where Element: Sendable {}
