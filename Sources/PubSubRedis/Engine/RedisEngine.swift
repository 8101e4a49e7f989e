import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import PubSubCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The clustered engine: sessions, subscriptions and routing live in Redis, so every node sees every session;
/// each session's queue and connection live on one node (its home), in a local `MemoryEngine`.
///
/// A publish is one script run: it takes the next position, appends the event to the shared history, and
/// sends one notification per node that has a subscriber (not one per recipient). The node fans the event out
/// to its own sessions. A session whose client connects to another node moves there: routing moves in the same
/// script, and the old node hands the queue over, so nothing is lost or reordered. See `RedisScripts`.
///
/// Every mutable field (the phase machine, waiters, ledger, gate, statistics, positions) is in `state`, behind its
/// lock; every stored property is a `let`, so the compiler checks that the engine is `Sendable`.
public final class RedisEngine: Engine, EngineObservability, Sendable {
    public let configuration: BrokerConfiguration
    public let settings: RedisEngineConfiguration
    public var node: String { settings.nodeID }
    let local: MemoryEngine
    let commands: RedisClient
    let subscriber: RedisClient
    /// Sentinel mode: finds the master and watches for failovers.
    let sentinel: SentinelMonitor?
    /// Cluster mode: finds the master serving the engine's slot and follows it.
    let cluster: ClusterMonitor?
    /// Redis Cluster: notifications are sharded (`SPUBLISH`, `SSUBSCRIBE`), scripts name a key of the slot.
    var sharded: Bool { cluster != nil }
    let group: MultiThreadedEventLoopGroup
    let logger: Logger
    /// Told about the session events that happen on this node (webhooks); see `RedisEngine+SessionEvents.swift`.
    let events: (any SessionEventObserver)?
    let keyPrefix: String
    let channelPrefix: String
    let notificationChannel: String
    /// Stands in for the position while an event is encoded; the script puts the real one there.
    let positionMarker: String
    /// Adds to a monotonic deadline to get milliseconds since the Unix epoch (shared by nodes).
    let wallOffsetMilliseconds: Int64
    /// A new epoch, should Redis have none (first start, or it restarted without its data). Fresh at every
    /// call: a restarted Redis must never get the epoch it had before, or old positions would look valid.
    var epochCandidate: UInt64 { UInt64.random(in: 1...(1 << 52)) }
    /// A new position key, made in Redis with the epoch when it has none (shared by every node from then on).
    var positionKeyCandidate: String { PositionKey.random().text }

    struct State: Sendable {
        var epoch: UInt64?
        /// The key of the position permutation in Redis, learnt with the epoch (a publish, a history read).
        var positionKey: PositionKey?
        var lastSequence: UInt64 = 0
        var published: UInt64 = 0
        /// Highest position delivered from notifications, in `deliveredEpoch`.
        var delivered: UInt64 = 0
        var deliveredEpoch: String?
        var adoptWaiters: [String: [EventLoopPromise<Void>]] = [:]
        var handoffWaiters: [String: EventLoopPromise<Void>] = [:]
        var abandoned: Set<String> = []
        var barriers: [UInt64: EventLoopPromise<Void>] = [:]
        var nextBarrier: UInt64 = 0
        var pendingDestroys: [(String, DetachReason)] = []
        /// Sentinel: the master this node's positions come from (set at each connection, see `reseat`).
        var termMaster: RedisEndpoint?
        /// Sentinel: the positions of this node's acknowledged publishes since `termMaster` (the newest, bounded),
        /// to count those a new master lacks.
        var acknowledged = CircularBuffer<UInt64>(initialCapacity: 64)
        var redis = RedisEngineStatistics()
        /// The phase of the engine's life: connecting, routing, filling from the history, serving, outage, closed.
        var machine = RedisEngineStateMachine()
        /// Resident sessions whose connects need no script (see `ResidencyLedger`); its lifetime is set in `init`.
        var ledger = ResidencyLedger<EventLoopPromise<Bool>>(lifetime: .seconds(90))
        /// Redis Cluster: scripts wait here, in order, while one is refused (slot migration).
        var gate = ClusterRetryGate<ScriptJob>(capacity: 10_000)
    }

    /// A script run waiting its turn at the gate.
    struct ScriptJob: Sendable {
        var script: RedisScripts.Script
        var arguments: [RESPArgument]
        /// Replicas that must confirm the script's writes (`WAIT`); 0: none.
        var replicas: Int = 0
        var promise: EventLoopPromise<RESPValue>
    }
    let state = NIOLockedValueBox(State())

    public init(
        configuration: BrokerConfiguration,
        settings: RedisEngineConfiguration,
        logger: Logger = Logger(label: "pubsub.redis"),
        events: (any SessionEventObserver)? = nil
    ) {
        self.configuration = configuration
        self.settings = settings
        self.logger = logger
        self.events = events
        var localConfiguration = configuration
        localConfiguration.historySize = 0
        // The local store logs what no connection sees: a client dropped for overflow between two polls.
        self.local = MemoryEngine(configuration: localConfiguration, logger: logger)
        self.group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let keyPrefix =
            settings.cluster == nil ? settings.keyPrefix : RedisClusterConfiguration.taggedPrefix(settings.keyPrefix)
        self.keyPrefix = keyPrefix
        self.channelPrefix = keyPrefix + String(settings.redis.database) + ":"
        self.notificationChannel = channelPrefix + "n:" + settings.nodeID
        self.positionMarker = "pos" + ClientID.random()
        var wall = timespec()
        clock_gettime(CLOCK_REALTIME, &wall)
        let wallMilliseconds = Int64(wall.tv_sec) * 1000 + Int64(wall.tv_nsec) / 1_000_000
        self.wallOffsetMilliseconds = wallMilliseconds - Int64(NIODeadline.now().uptimeNanoseconds / 1_000_000)
        let loop = group.next()
        let setup = RedisScripts.all.map {
            RESPCommand("SCRIPT", "LOAD", .string($0.variant(sharded: settings.cluster != nil).source))
        }
        // The clients' and monitors' callbacks reach the engine through a weak reference: the engine owns them,
        // and they must not keep it alive (RedisEngineLifetimeTests).
        let box = WeakEngine()
        let sentinel = settings.sentinel.map { sentinelSettings in
            SentinelMonitor(settings: sentinelSettings, eventLoop: loop, logger: logger) { why in
                box.engine?.rediscover(because: why)
            }
        }
        self.sentinel = sentinel
        let cluster = settings.cluster.map { clusterSettings in
            ClusterMonitor(settings: clusterSettings, probeKey: keyPrefix, eventLoop: loop, logger: logger) { why in
                box.engine?.rediscover(because: why)
            }
        }
        self.cluster = cluster
        var resolve: (@Sendable () -> EventLoopFuture<RedisEndpoint>)?
        var verifyCommands: (@Sendable (RedisEndpoint, @escaping RedisClient.Sender) -> EventLoopFuture<Void>)?
        var verifySubscriber: (@Sendable (RedisEndpoint, @escaping RedisClient.Sender) -> EventLoopFuture<Void>)?
        var onRedirect: (@Sendable (String) -> Void)?
        let locator: (any MasterLocator)? = sentinel ?? cluster
        if let locator {
            resolve = { locator.resolve() }
            verifyCommands = { endpoint, send in
                locator.verify(endpoint, send: send).flatMap { _ -> EventLoopFuture<Void> in
                    guard let engine = box.engine else { return loop.makeSucceededVoidFuture() }
                    return engine.reseat(at: endpoint, send: send)
                }
            }
            verifySubscriber = { endpoint, send in locator.verify(endpoint, send: send).map { _ in } }
            onRedirect = { message in locator.redirected(message) }
        }
        self.commands = RedisClient(
            configuration: settings.redis, eventLoop: loop, name: "commands", setup: setup, logger: logger,
            resolve: resolve, verify: verifyCommands, onRedirect: onRedirect,
            onEvent: { event in box.engine?.commandsEvent(event) })
        self.subscriber = RedisClient(
            configuration: settings.redis, eventLoop: loop, name: "notifications", logger: logger,
            resolve: resolve, verify: verifySubscriber,
            onPush: { push in box.engine?.received(push) },
            onEvent: { event in box.engine?.subscriberEvent(event) })
        box.engine = self
        let lifetime = TimeAmount.nanoseconds(configuration.timeout.nanoseconds * 2)
        state.withLockedValue { $0.ledger = ResidencyLedger(lifetime: lifetime) }
    }

    /// Connects to Redis; the future completes when both connections are up, or fails after `timeout`
    /// (the engine keeps trying in the background either way).
    @discardableResult
    public func start(timeout: TimeAmount = .seconds(5)) -> EventLoopFuture<Void> {
        sentinel?.start()
        commands.start()
        subscriber.start()
        let loop = commands.eventLoop
        let promise = loop.makePromise(of: Void.self)
        let deadline = NIODeadline.now() + timeout
        @Sendable func check() {
            if isReady { return promise.succeed(()) }
            if NIODeadline.now() > deadline {
                let cause = (self.commands.lastError ?? self.subscriber.lastError).map { ": \($0)" } ?? ""
                return promise.fail(RedisError(.notConnected, "no connection to \(self.redisDescription)\(cause)"))
            }
            loop.scheduleTask(in: .milliseconds(10)) { check() }
        }
        loop.execute { check() }
        return promise.futureResult
    }

    /// Both connections are up, this node receives its notifications, and (Sentinel) a sentinel confirmed the
    /// master lately: a node cut off from the sentinels may be writing to a master they have replaced.
    public var isReady: Bool {
        commands.isConnected && subscriber.isConnected
            && state.withLockedValue { $0.machine.isServing } && (sentinel?.isConfirmed ?? true)
    }

    public var readinessNote: String? {
        if !commands.isConnected || !subscriber.isConnected {
            let cause = (commands.lastError ?? subscriber.lastError).map { ": \($0)" } ?? ""
            return "no connection to \(redisDescription)\(cause)"
        }
        if !state.withLockedValue({ $0.machine.isServing }) { return "catching up with Redis after reconnecting" }
        return sentinel?.unconfirmedNote
    }

    public var redisStatistics: RedisEngineStatistics { state.withLockedValue { $0.redis } }

    /// Where Redis is, for logs: the URL (without password), the sentinels and the master's name, or the
    /// cluster's nodes and the engine's slot.
    public var redisDescription: String {
        if let cluster = settings.cluster {
            return "Redis Cluster " + cluster.seeds.map(\.description).joined(separator: ",")
                + " (slot \(ClusterSlot.of(keyPrefix)) of '\(keyPrefix)')"
        }
        guard let sentinel = settings.sentinel else { return settings.redis.redacted }
        return "master '\(sentinel.masterName)' of sentinels "
            + sentinel.sentinels.map(\.description).joined(separator: ",")
    }

    /// `RedisEngineStatistics` on `/metrics`.
    public var extraMetrics: [EngineMetric] {
        let s = redisStatistics
        func counter(_ name: String, _ value: UInt64, _ help: String) -> EngineMetric {
            EngineMetric(name: "pubsub_redis_" + name + "_total", help: help, kind: .counter, value: value)
        }
        return [
            counter("outages", s.outages, "Times the Redis command connection was lost."),
            counter(
                "local_only_publishes", s.localOnlyPublishes,
                "Publishes made while Redis was unreachable, delivered to this node's subscribers only."),
            counter(
                "refused_publishes", s.refusedPublishes,
                "Publishes refused while Redis was unreachable, for the publisher to retry (--redis-when-away refuse)."),
            counter(
                "unreplicated_publishes", s.unreplicatedPublishes,
                "Publishes fewer replicas than --redis-wait-replicas confirmed in time: delivered, answered with an error."
            ),
            counter(
                "uncertain_publishes", s.uncertainPublishes,
                "Publishes whose Redis connection broke before the answer: delivered or not."),
            counter(
                "recovered_after_cut", s.recoveredAfterCut,
                "Events found in the history after the notification connection was cut, delivered late."),
            counter(
                "missed_after_cut", s.missedAfterCut,
                "Positions the history no longer held after a notification cut (an upper bound of what was missed)."),
            counter(
                "sessions_told_of_gap", s.toldOfGap,
                "Sessions told they missed events after such a gap or a Redis that lost its data: dropped, to handshake again."
            ),
            counter(
                "abandoned_handoffs", s.abandonedHandoffs,
                "Sessions taken over from a node that did not hand their queue over in time."),
            counter("claims", s.claims, "Sessions moved to this node."),
            counter(
                "batched_connects", s.batchedConnects,
                "Connects of sessions confirmed on this node, served with a batched expiry refresh instead of a script."
            ),
            counter(
                "connect_batches", s.connectBatches,
                "Batches of expiry refreshes and a barrier sent for those connects."),
            counter("swept_sessions", s.sweptSessions, "Sessions expired by this node's sweeps."),
            counter("events_received", s.eventsReceived, "Events received from Redis for this node's subscribers."),
            counter(
                "sessions_restored", s.sessionsRestored,
                "Sessions of this node that Redis no longer had after a reconnect or failover, put back."),
            counter(
                "cluster_retries", s.clusterRetries,
                "Cluster: scripts sent again because the engine's slot was moving or had moved (ASK, TRYAGAIN, MOVED)."),
            counter("failovers", s.failovers, "Sentinel or Cluster: new Redis masters this node moved to."),
            counter(
                "failover_lost_publishes", s.failoverLostPublishes,
                "Sentinel or Cluster: this node's acknowledged publishes that the new master does not have (not replicated)."
            ),
            counter(
                "failover_lost_positions", s.failoverLostPositions,
                "Sentinel or Cluster: positions this node had seen beyond the new master's last one at a failover."),
        ]
    }

    public var statistics: EngineStatistics {
        var s = local.statistics
        s.published = state.withLockedValue { $0.published }
        return s
    }

    public var position: String? {
        guard configuration.historySize > 0 else { return nil }
        return state.withLockedValue { s in
            guard let epoch = s.epoch, let key = s.positionKey else { return nil }
            return Position(epoch: epoch, sequence: s.lastSequence).token(key: key)
        }
    }

    /// What a script said of the positions in Redis: the latest sequence (of `epoch`), and the position key.
    func learn(sequence: UInt64?, epoch: UInt64?, key: PositionKey?) {
        state.withLockedValue { s in
            if let key { s.positionKey = key }
            guard let sequence else { return }
            if let epoch, epoch != s.epoch {
                s.epoch = epoch
                s.lastSequence = sequence
            }
            s.lastSequence = max(s.lastSequence, sequence)
        }
    }

    func milliseconds(_ deadline: NIODeadline) -> Int64 {
        Int64(deadline.uptimeNanoseconds / 1_000_000) + wallOffsetMilliseconds
    }

    var lifetimeMilliseconds: Int64 { configuration.timeout.nanoseconds * 2 / 1_000_000 }

    func expiry(_ now: NIODeadline) -> RESPArgument { .integer(milliseconds(now) + lifetimeMilliseconds) }

    /// Runs a script by its digest, loading it if Redis lost it (after a restart, before the setup ran).
    /// In Redis Cluster, a script refused because the engine's slot is moving or has moved (`ASK`, `TRYAGAIN`,
    /// `MOVED`: it did not run) is sent again after a short delay, until the slot has settled where the commands
    /// connection follows it (`ClusterStateMachine.retryDelay`); `ClusterRetryGate` keeps scripts in order
    /// meanwhile.
    /// Runs a script; with `replicas`, fails with `notReplicated` unless that many replicas confirmed its writes.
    func eval(_ script: RedisScripts.Script, _ arguments: [RESPArgument], replicas: Int = 0)
        -> EventLoopFuture<RESPValue>
    {
        guard sharded else { return send(script, arguments, replicas: replicas) }
        let job = ScriptJob(
            script: script, arguments: arguments, replicas: replicas, promise: commands.eventLoop.makePromise())
        switch state.withLockedValue({ $0.gate.admit(job) }) {
        case .send(let ticket):
            run(job, ticket: ticket, attempt: 0)
        case .held:
            break
        case .refused:
            let waiting = state.withLockedValue { $0.gate.capacity }
            job.promise.fail(
                RedisError(.notConnected, "\(waiting) scripts already wait for the engine's slot to settle"))
        }
        return job.promise.futureResult
    }

    private func send(_ script: RedisScripts.Script, _ arguments: [RESPArgument], replicas: Int)
        -> EventLoopFuture<RESPValue>
    {
        let common = scriptPrelude
        let commands = self.commands
        let variant = script.variant(sharded: sharded)
        let byHash = RESPCommand(["EVALSHA", .string(variant.sha)] + common + arguments)
        let bySource = RESPCommand(["EVAL", .string(variant.source)] + common + arguments)
        guard replicas > 0 else {
            return commands.send(byHash).flatMapError { error in
                if let e = error as? RedisError, e.code == .server, e.message.hasPrefix("NOSCRIPT") {
                    return commands.send(bySource)
                }
                return commands.eventLoop.makeFailedFuture(error)
            }
        }
        // WAIT counts the replicas that hold this connection's writes so far: it goes in the same write as the
        // script, so that it is the script's connection it asks about, whatever reconnects meanwhile.
        let timeout = min(settings.waitTimeout, settings.redis.commandTimeout - .milliseconds(500))
        let wait = RESPCommand(["WAIT", .integer(Int64(replicas)), .integer(max(1, timeout.nanoseconds / 1_000_000))])
        return commands.send([byHash, wait]).flatMap { replies -> EventLoopFuture<[RESPValue]> in
            if case .error(let message) = replies[0], message.hasPrefix("NOSCRIPT") {
                return commands.send([bySource, wait])
            }
            return commands.eventLoop.makeSucceededFuture(replies)
        }.flatMapThrowing { replies in
            if case .error(let message) = replies[0] { throw RedisError(.server, message) }
            let confirmed = replies.count > 1 ? replies[1].int ?? 0 : 0
            guard confirmed >= replicas else {
                throw RedisError(
                    .notReplicated, "\(confirmed) of \(replicas) replicas confirmed the write in \(timeout)")
            }
            return replies[0]
        }
    }

    /// Sends a script of the gate's and tells the gate how it went (Redis Cluster).
    private func run(_ job: ScriptJob, ticket: UInt64, attempt: Int) {
        send(job.script, job.arguments, replicas: job.replicas).whenComplete { result in
            var outcome = ClusterRetryGate<ScriptJob>.Outcome.done
            if case .failure(let error) = result {
                if let delay = ClusterStateMachine.retryDelay(after: error, attempt: attempt) {
                    outcome = .retry(after: delay)
                } else if attempt > 0, ClusterStateMachine.retryDelay(after: error, attempt: 1) != nil {
                    outcome = .gaveUp  // refused each time it was sent: out of attempts
                }
            }
            let actions = self.state.withLockedValue { s in
                if case .retry = outcome { s.redis.clusterRetries += 1 }
                return s.gate.finished(ticket: ticket, job: job, attempt: attempt, outcome: outcome)
            }
            switch (outcome, result) {
            case (.retry, _):
                break
            case (.gaveUp, .failure(let error)):
                // Every refusal said the script did not run: as during an outage.
                job.promise.fail(RedisError(.notConnected, "refused \(attempt + 1) times by the cluster: \(error)"))
            default:
                job.promise.completeWith(result)
            }
            for action in actions {
                switch action {
                case .send(let entry):
                    self.run(entry.job, ticket: entry.ticket, attempt: entry.attempt)
                case .schedule(let entry, let delay):
                    self.commands.eventLoop.scheduleTask(in: delay) {
                        self.run(entry.job, ticket: entry.ticket, attempt: entry.attempt)
                    }.futureResult.whenFailure { entry.job.promise.fail($0) }
                case .fail(let jobs):
                    // Never sent: as during an outage (a publish reaches this node's subscribers only).
                    let error = RedisError(.notConnected, "not sent: the engine's slot stayed unavailable")
                    for queued in jobs { queued.promise.fail(error) }
                }
            }
        }
    }

    /// What every script run starts with: its keys (in Redis Cluster one, of the engine's slot, so that the
    /// server answers `MOVED` rather than run where the slot is not served), then P and C.
    var scriptPrelude: [RESPArgument] {
        sharded
            ? [1, .string(keyPrefix), .string(keyPrefix), .string(channelPrefix)]
            : [0, .string(keyPrefix), .string(channelPrefix)]
    }

    /// `PUBLISH`, or `SPUBLISH` in Redis Cluster (the notification channels are sharded).
    var publishCommand: String { sharded ? "SPUBLISH" : "PUBLISH" }

    var isConnected: Bool { commands.isConnected }

    /// Completes once every notification sent to this node before the call has been handled, and the deliveries
    /// it caused have been handed to their sinks' event loops.
    public func settle() -> EventLoopFuture<Void> { settle(within: nil) }

    /// `settle`, failing after `timeout` (a barrier lost on its way) or at once when nobody listens on this node's
    /// channel ((S)PUBLISH answers 0: the barrier would never come).
    func settle(within timeout: TimeAmount?) -> EventLoopFuture<Void> {
        let loop = commands.eventLoop
        let promise = loop.makePromise(of: Void.self)
        let n = state.withLockedValue { s -> UInt64 in
            s.nextBarrier += 1
            s.barriers[s.nextBarrier] = promise
            return s.nextBarrier
        }
        commands.send(
            RESPCommand(publishCommand, .string(notificationChannel), .bytes(NodeMessage.barrier(n).encoded()))
        ).whenComplete { result in
            if case .success(let reply) = result, (reply.int ?? 0) > 0 { return }
            let error: any Error
            switch result {
            case .failure(let e): error = e
            case .success: error = RedisError(.connectionClosed, "nobody listens on this node's channel")
            }
            self.state.withLockedValue { $0.barriers.removeValue(forKey: n) }?.fail(error)
        }
        guard let timeout else { return promise.futureResult }
        return bounded(promise.futureResult, by: timeout) {
            let error = RedisError(.timeout, "no barrier back")
            self.state.withLockedValue { $0.barriers.removeValue(forKey: n) }?.fail(error)
            return error
        }
    }

    public func shutdown() {
        local.shutdown()
        guard state.withLockedValue({ $0.machine.close() }) == .close else { return }
        failWaitingScripts()
        let group = self.group
        let subscriber = self.subscriber
        let commands = self.commands
        _ = sentinel?.close()
        // Stop listening first, so that nodes taking our sessions over do not wait for a handoff.
        subscriber.close().flatMap { _ in
            commands.send(RESPCommand("DEL", .string(self.keyPrefix + "alive:" + self.node))).map { _ in }
                .recover { _ in }
        }.flatMap { commands.close() }.whenComplete { _ in
            group.shutdownGracefully { _ in }
        }
    }

    /// Scripts and barriers still waiting fail before the connections and the thread go: a promise left
    /// pending on a loop that shut down is never completed (a resume's subscribe waits on a barrier).
    private func failWaitingScripts() {
        let (jobs, barriers) = state.withLockedValue { s in
            defer { s.barriers = [:] }
            return (s.gate.drain(), Array(s.barriers.values))
        }
        for job in jobs { job.promise.fail(RedisError(.closed)) }
        for barrier in barriers { barrier.fail(RedisError(.closed)) }
    }

    /// Closes the Redis connections and stops the engine's thread (tests; `shutdown` does it too).
    public func close() async {
        local.shutdown()
        guard state.withLockedValue({ $0.machine.close() }) == .close else { return }
        failWaitingScripts()
        _ = try? await sentinel?.close().get()
        _ = try? await commands.close().and(subscriber.close()).get()
        try? await group.shutdownGracefully()
    }
}

/// The engine, for the callbacks of what it owns, without keeping it alive.
private final class WeakEngine: Sendable {
    private let box = NIOLockedValueBox<Weak>(Weak())
    private struct Weak {
        weak var engine: RedisEngine?
    }

    var engine: RedisEngine? {
        get { box.withLockedValue { $0.engine } }
        set { box.withLockedValue { $0.engine = newValue } }
    }
}
