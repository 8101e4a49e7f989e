import Bayeux
import CoreMetrics
import Logging
import NIOConcurrencyHelpers
import NIOCore

/// The relay loop for one source: read a batch → publish it and wait for the broker's acknowledgement → persist
/// the checkpoint durably → confirm to the source. Delivery is at least once and never has a gap: a crash at any
/// instant resumes from the last persisted checkpoint, and what the source replays at or below it is skipped.
/// `run()` writes the checkpoint behind the publishes (`CheckpointWriter`); `step()` does all four in turn.
public struct Relay: Sendable {
    public struct Configuration: Sendable {
        public var mapping: ChangeMapping
        /// Pause after a failed publish before the same batch is tried again (doubles up to `maxRetryDelay`).
        public var retryDelay: TimeAmount
        public var maxRetryDelay: TimeAmount
        /// How often progress (changes/s, lag) is logged while there is a backlog.
        public var progressInterval: TimeAmount
        /// With routes, over a source that does not give old values: where the routed values of the documents
        /// last seen are kept (`AudienceMemory`; nil keeps them in memory only), and how many at most.
        public var audiencePath: String?
        public var rememberedDocuments: Int
        /// The most acknowledged batches waiting for their checkpoint before the relay stops publishing until the
        /// write under way is durable (`CheckpointPipeline`).
        public var checkpointBacklog: Int

        public init(
            mapping: ChangeMapping = ChangeMapping(), retryDelay: TimeAmount = .milliseconds(200),
            maxRetryDelay: TimeAmount = .seconds(5), progressInterval: TimeAmount = .seconds(2),
            audiencePath: String? = nil, rememberedDocuments: Int = 100_000, checkpointBacklog: Int = 1024
        ) {
            self.checkpointBacklog = checkpointBacklog
            self.audiencePath = audiencePath
            self.rememberedDocuments = rememberedDocuments
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
    /// The routed values of documents last seen, for a source whose changes lack their old values.
    let memory: AudienceMemory?

    public init(
        source: any ChangeSource, publisher: any Publisher, store: any CheckpointStore,
        configuration: Configuration = Configuration(), logger: Logger
    ) {
        self.source = source
        self.publisher = publisher
        self.store = store
        self.configuration = configuration
        self.logger = logger
        self.metrics = RelayMetrics(sourceID: source.sourceID)
        let needsMemory = !configuration.mapping.routeList.isEmpty && !source.givesPreviousValues
        self.memory =
            needsMemory
            ? AudienceMemory(limit: configuration.rememberedDocuments, path: configuration.audiencePath) : nil
    }

    /// Loads the checkpoint and starts the source after it.
    public func start() async throws {
        let checkpoint = try store.load()
        if let checkpoint, checkpoint.sourceID != source.sourceID {
            throw RelayError(
                .checkpoint,
                "the checkpoint belongs to \(checkpoint.sourceID), not \(source.sourceID): use another --checkpoint file"
            )
        }
        logger.info(
            "relay starting",
            metadata: [
                "pubsub.relay.source": "\(source.sourceID)",
                "pubsub.relay.checkpoint": "\(checkpoint?.position ?? "none")",
            ])
        if let memory {
            try memory.load()
            logger.info(
                "relay remembers the routed values of \(memory.count) documents",
                metadata: [
                    "pubsub.relay.source": "\(source.sourceID)", "pubsub.relay.limit": "\(memory.limit)",
                ])
        }
        try await source.start(after: checkpoint?.position)
    }

    /// Relays the next batch: publish (retrying until acknowledged), persist, confirm. Returns the number of
    /// messages published, or nil once the source is closed.
    @discardableResult
    public func step() async throws -> Int? {
        guard let batch = try await source.next() else { return nil }
        return try await relay(batch)
    }

    /// Publish → ack → persist → confirm for one batch. A failed publish is retried (with the same keys); a
    /// failed persist or confirm throws, leaving the source unconfirmed.
    public func relay(_ batch: ChangeBatch) async throws -> Int {
        let count = try await publish(batch)
        try memory?.save()
        try store.save(Checkpoint(sourceID: source.sourceID, position: batch.position))
        try await source.confirm(batch.position)
        return count
    }

    /// Maps `batch` to messages and publishes them, retrying until the broker acknowledged every one. Returns how
    /// many were published.
    func publish(_ batch: ChangeBatch) async throws -> Int {
        if let resync = batch.resync {
            metrics.resyncs.increment()
            logger.error(
                "relay: the source could not resume from the checkpoint; FULL RESYNC from a snapshot",
                metadata: [
                    "pubsub.relay.source": "\(source.sourceID)", "pubsub.relay.reason": "\(resync.reason)",
                ])
        }
        var messages: [RelayMessage] = []
        messages.reserveCapacity(batch.changes.count)
        for var change in batch.changes {
            if let memory, let routes = configuration.mapping.routes[change.collection.joined(separator: ".")] {
                if change.previous == nil, change.operation == .update || change.operation == .delete {
                    change.previous = memory.previous(of: change)
                    // A resync (or a first run from `since=0`) of a document never seen: it is its own audience's.
                    if change.previous == nil, change.operation == .update, change.extra["resync"] == true {
                        change.previous = change.document
                    }
                }
                memory.remember(change, routes: routes)
            }
            let mapped = configuration.mapping.messages(for: change, sourceID: source.sourceID)
            messages.append(contentsOf: mapped.messages)
            for unrouted in mapped.unrouted { report(unrouted, change: change) }
        }
        if !messages.isEmpty {
            var backoff = Backoff(initial: configuration.retryDelay, maximum: configuration.maxRetryDelay)
            while true {
                do {
                    try await publisher.publish(messages)
                    break
                } catch is CancellationError {
                    throw CancellationError()
                } catch {
                    metrics.publishFailures.increment()
                    logger.warning(
                        "publish failed, retrying the batch",
                        metadata: [
                            "pubsub.relay.source": "\(source.sourceID)", "pubsub.relay.error": "\(error)",
                            "pubsub.relay.batch": "\(messages.count)",
                        ])
                    try await backoff.wait()
                }
            }
        }
        metrics.changes.increment(by: batch.changes.count)
        metrics.messages.increment(by: messages.count)
        return messages.count
    }

    /// A route that gave a change no channel: counted every time, logged once per collection, route and reason.
    private func report(_ unrouted: ChangeMapping.Unrouted, change: Change) {
        metrics.unrouted(unrouted).increment()
        guard metrics.firstTime(unrouted) else { return }
        let what: String =
            switch unrouted.reason {
            case .null: "a routed field is NULL or missing: the change goes to no channel of this route"
            case .type: "a routed field is an object or an array (write {field[]} to fan out over an array)"
            case .empty: "a routed array field is empty: the change has no audience on this route"
            case .fanOut:
                "a routed array names more than \(configuration.mapping.maxChannelsPerRoute) channels: none is sent"
            case .noPrevious: "the previous values of an update or delete are unknown: its old audience is not told"
            }
        logger.warning(
            "relay: \(what) (logged once per route and reason; counted in pubsub_relay_unrouted_total)",
            metadata: [
                "pubsub.relay.source": "\(source.sourceID)", "pubsub.relay.route": "\(unrouted.route)",
                "pubsub.relay.reason": "\(unrouted.reason.rawValue)", "pubsub.relay.id": "\(change.id ?? "")",
            ])
    }

    /// Runs until cancelled or a non-retryable error; logs progress while catching up. Each batch is relayed as the
    /// source's reader hands it over (`PushFeed`), and the reader reads on (up to its stream's capacity, and for a
    /// polled feed to the end of its poll) while the batch before is published.
    ///
    /// The checkpoint is written behind the publishes (`CheckpointWriter`): the next batch is published while the
    /// checkpoint of the ones before is made durable, and the source is confirmed once it is. With routes over a
    /// source that lacks old values, the remembered values must not run ahead of the checkpoint, so there each
    /// batch is persisted before the next is published. `started` is called once the source has started.
    public func run(started: (@Sendable () -> Void)? = nil) async throws {
        try await start()
        started?()
        guard memory == nil else {
            var progress = Progress()
            while let batch = try await source.next() {
                progress.add(try await relay(batch))
                await report(&progress)
            }
            // A source ends its stream only when it is closed; anything else is a restart's business.
            if !Task.isCancelled { throw RelayError(.source, "the feed ended") }
            return
        }
        let writer = CheckpointWriter(capacity: configuration.checkpointBacklog)
        let (source, store) = (source, store)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await writer.run(
                    save: { try store.save(Checkpoint(sourceID: source.sourceID, position: $0)) },
                    confirm: { try await source.confirm($0) })
            }
            group.addTask {
                defer { writer.finish() }
                var progress = Progress()
                while let batch = try await source.next() {
                    progress.add(try await publish(batch))
                    try await writer.acknowledged(batch.position)
                    await report(&progress)
                }
                if !Task.isCancelled { throw RelayError(.source, "the feed ended") }
            }
            // The first to end with an error ends the other: a failed write stops the relay at once, however
            // quiet the feed; the relay's end lets the writer write what waits, then end.
            do {
                while try await group.next() != nil {}
            } catch {
                group.cancelAll()
                throw error
            }
        }
    }

    /// Changes published in the current progress window.
    struct Progress {
        var published = 0
        var busy = false
        var windowStart = ContinuousClock.now

        mutating func add(_ count: Int) {
            guard count > 0 else { return }
            published += count
            busy = true
        }
    }

    /// Logs progress (and records the lag) once per `progressInterval` in which something was published.
    private func report(_ progress: inout Progress) async {
        let elapsed = ContinuousClock.now - progress.windowStart
        guard elapsed >= .nanoseconds(configuration.progressInterval.nanoseconds) else { return }
        if progress.busy {
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            let lag = await source.lag()
            if let lag { metrics.lag(unit: lag.unit).record(lag.amount) }
            logger.info(
                "relay progress",
                metadata: [
                    "pubsub.relay.source": "\(source.sourceID)",
                    "pubsub.relay.changes_per_second": "\(Int((Double(progress.published) / seconds).rounded()))",
                    "pubsub.relay.lag": "\(lag.map { "\($0.amount) \($0.unit)" } ?? "unknown")",
                ])
        }
        progress = Progress()
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
    /// Messages published and acknowledged (a routed change gives one per channel of its audience).
    let messages: Counter
    /// The routes already logged as unroutable, by reason: each is logged once.
    private let logged = NIOLockedValueBox(Set<ChangeMapping.Unrouted>())

    init(sourceID: String) {
        self.sourceID = sourceID
        let dimensions = [("source", sourceID)]
        changes = Counter(label: "pubsub_relay_changes_total", dimensions: dimensions)
        resyncs = Counter(label: "pubsub_relay_resyncs_total", dimensions: dimensions)
        publishFailures = Counter(label: "pubsub_relay_publish_failures_total", dimensions: dimensions)
        messages = Counter(label: "pubsub_relay_messages_total", dimensions: dimensions)
    }

    /// Changes a route gave no channel, by collection, route and reason.
    func unrouted(_ unrouted: ChangeMapping.Unrouted) -> Counter {
        Counter(
            label: "pubsub_relay_unrouted_total",
            dimensions: [
                ("source", sourceID), ("collection", unrouted.route.collection), ("route", unrouted.route.template),
                ("reason", unrouted.reason.rawValue),
            ])
    }

    /// Whether `unrouted` is seen for the first time (then it is logged).
    func firstTime(_ unrouted: ChangeMapping.Unrouted) -> Bool {
        logged.withLockedValue { $0.insert(unrouted).inserted }
    }

    /// How far behind the feed's head the source was at the last progress line, in the source's unit.
    func lag(unit: String) -> Gauge {
        Gauge(label: "pubsub_relay_lag", dimensions: [("source", sourceID), ("unit", unit)])
    }
}
