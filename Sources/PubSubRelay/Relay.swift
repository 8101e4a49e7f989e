import CoreMetrics
import Logging
import NIOCore

/// The relay loop for one source: read a batch → publish it and wait for the broker's acknowledgement → persist
/// the checkpoint durably → confirm to the source. Delivery is at least once and never has a gap: a crash at any
/// instant resumes from the last persisted checkpoint, and what the source replays at or below it is skipped.
public struct Relay: Sendable {
    public struct Configuration: Sendable {
        public var mapping: ChangeMapping
        /// Pause after a failed publish before the same batch is tried again (doubles up to `maxRetryDelay`).
        public var retryDelay: TimeAmount
        public var maxRetryDelay: TimeAmount
        /// How often progress (changes/s, lag) is logged while there is a backlog.
        public var progressInterval: TimeAmount

        public init(mapping: ChangeMapping = ChangeMapping(), retryDelay: TimeAmount = .milliseconds(200),
                    maxRetryDelay: TimeAmount = .seconds(5), progressInterval: TimeAmount = .seconds(2)) {
            self.mapping = mapping
            self.retryDelay = retryDelay
            self.maxRetryDelay = maxRetryDelay
            self.progressInterval = progressInterval
        }
    }

    public var source: any ChangeSource
    public var publisher: any Publisher
    public var store: any CheckpointStore
    public var configuration: Configuration
    public var logger: Logger
    let metrics: RelayMetrics

    public init(source: any ChangeSource, publisher: any Publisher, store: any CheckpointStore,
                configuration: Configuration = Configuration(), logger: Logger) {
        self.source = source
        self.publisher = publisher
        self.store = store
        self.configuration = configuration
        self.logger = logger
        self.metrics = RelayMetrics(sourceID: source.sourceID)
    }

    /// Loads the checkpoint and starts the source after it.
    public func start() async throws {
        let checkpoint = try store.load()
        if let checkpoint, checkpoint.sourceID != source.sourceID {
            throw RelayError(.checkpoint,
                "the checkpoint belongs to \(checkpoint.sourceID), not \(source.sourceID): use another --checkpoint file")
        }
        logger.info("relay starting", metadata: [
            "pubsub.relay.source": "\(source.sourceID)",
            "pubsub.relay.checkpoint": "\(checkpoint?.position ?? "none")",
        ])
        try await source.start(after: checkpoint?.position)
    }

    /// Relays one batch if there is one: publish (retrying until acknowledged), persist, confirm. Returns the
    /// number of changes published, or nil when the source had nothing new.
    @discardableResult
    public func step() async throws -> Int? {
        guard let batch = try await source.next() else { return nil }
        return try await relay(batch)
    }

    /// Publish → ack → persist → confirm for one batch. A failed publish is retried (with the same keys); a
    /// failed persist or confirm throws, leaving the source unconfirmed.
    public func relay(_ batch: ChangeBatch) async throws -> Int {
        if let resync = batch.resync {
            metrics.resyncs.increment()
            logger.error("relay: the source could not resume from the checkpoint; FULL RESYNC from a snapshot", metadata: [
                "pubsub.relay.source": "\(source.sourceID)", "pubsub.relay.reason": "\(resync.reason)",
            ])
        }
        let messages = batch.changes.map { configuration.mapping.message(for: $0, sourceID: source.sourceID) }
        if !messages.isEmpty {
            var delay = configuration.retryDelay
            while true {
                do {
                    try await publisher.publish(messages)
                    break
                } catch is CancellationError {
                    throw CancellationError()
                } catch {
                    metrics.publishFailures.increment()
                    logger.warning("publish failed, retrying the batch", metadata: [
                        "pubsub.relay.source": "\(source.sourceID)", "pubsub.relay.error": "\(error)",
                        "pubsub.relay.batch": "\(messages.count)",
                    ])
                    try await Task.sleep(nanoseconds: UInt64(delay.nanoseconds))
                    delay = min(delay * 2, configuration.maxRetryDelay)
                }
            }
        }
        try store.save(Checkpoint(sourceID: source.sourceID, position: batch.position))
        try await source.confirm(batch.position)
        metrics.changes.increment(by: messages.count)
        return messages.count
    }

    /// Runs until cancelled or a non-retryable error; logs progress while catching up. With a source that
    /// `readsAhead`, the next batch is read while the current one is published.
    public func run(idle: TimeAmount = .milliseconds(100)) async throws {
        try await start()
        var published = 0
        var windowStart = ContinuousClock.now
        var busy = false
        var current = try await source.next()
        while !Task.isCancelled {
            var count: Int?
            if let batch = current {
                if source.readsAhead {
                    async let following = source.next()
                    count = try await relay(batch)
                    current = try await following
                    // Read while the batch was published, it may have found nothing that came meanwhile: look
                    // again at once rather than after an idle pause.
                    if current == nil { current = try await source.next() }
                } else {
                    count = try await relay(batch)
                    current = try await source.next()
                }
            }
            if let count, count > 0 {
                published += count
                busy = true
            }
            let elapsed = ContinuousClock.now - windowStart
            if elapsed >= .nanoseconds(configuration.progressInterval.nanoseconds) {
                if busy {
                    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
                    let lag = await source.lag()
                    if let lag { metrics.lag(unit: lag.unit).record(lag.amount) }
                    logger.info("relay progress", metadata: [
                        "pubsub.relay.source": "\(source.sourceID)",
                        "pubsub.relay.changes_per_second": "\(Int((Double(published) / seconds).rounded()))",
                        "pubsub.relay.lag": "\(lag.map { "\($0.amount) \($0.unit)" } ?? "unknown")",
                    ])
                }
                published = 0
                busy = false
                windowStart = ContinuousClock.now
            }
            if current == nil {
                try await Task.sleep(nanoseconds: UInt64(idle.nanoseconds))
                current = try await source.next()
            }
        }
    }
}

/// The relay's metrics through swift-metrics: on `/metrics` when the relay runs inside `pubsub serve`, or wherever
/// the process bootstrapped its metrics system.
struct RelayMetrics: Sendable {
    let sourceID: String
    /// Changes published and acknowledged.
    let changes: Counter
    /// Full resyncs after an unknown position.
    let resyncs: Counter
    /// Publish attempts that failed and were retried.
    let publishFailures: Counter

    init(sourceID: String) {
        self.sourceID = sourceID
        let dimensions = [("source", sourceID)]
        changes = Counter(label: "pubsub_relay_changes_total", dimensions: dimensions)
        resyncs = Counter(label: "pubsub_relay_resyncs_total", dimensions: dimensions)
        publishFailures = Counter(label: "pubsub_relay_publish_failures_total", dimensions: dimensions)
    }

    /// How far behind the feed's head the source was at the last progress line, in the source's unit.
    func lag(unit: String) -> Gauge {
        Gauge(label: "pubsub_relay_lag", dimensions: [("source", sourceID), ("unit", unit)])
    }
}
