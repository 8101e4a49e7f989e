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

/// Settings of the Redis engine beyond the broker's own.
public struct RedisEngineConfiguration: Sendable {
    /// The Redis server; with `sentinel`, how to talk to the master (password, database, TLS), whose address
    /// the sentinels give.
    public var redis: RedisConfiguration
    /// Redis Sentinel: the master is found through the sentinels and followed through failovers.
    public var sentinel: RedisSentinelConfiguration?
    /// Prepended to every key; nodes sharing a prefix (and a database) form one cluster.
    public var keyPrefix: String
    /// This node's name in Redis; unique per process.
    public var nodeID: String
    /// The expiry sweep runs at most once per period across the cluster; 0 runs it at every `sweep` call.
    public var sweepPeriod: TimeAmount
    /// How long a connect waits for the queue of a session coming from another live node.
    public var handoffTimeout: TimeAmount
    /// Sessions expired per sweep, at most.
    public var sweepBatch: Int

    public init(
        redis: RedisConfiguration = .init(),
        keyPrefix: String = "pubsub:",
        nodeID: String = String(ClientID.random().prefix(12)),
        sweepPeriod: TimeAmount = .seconds(1),
        handoffTimeout: TimeAmount = .seconds(1),
        sweepBatch: Int = 1000,
        sentinel: RedisSentinelConfiguration? = nil
    ) {
        self.redis = redis
        self.sentinel = sentinel
        self.keyPrefix = keyPrefix
        self.nodeID = nodeID
        self.sweepPeriod = sweepPeriod
        self.handoffTimeout = handoffTimeout
        self.sweepBatch = sweepBatch
    }
}

/// What the Redis engine counts beyond `EngineStatistics`.
public struct RedisEngineStatistics: Sendable, Equatable {
    /// Times the command connection was lost.
    public var outages: UInt64 = 0
    /// Publishes made while Redis was unreachable: delivered to this node's subscribers only.
    public var localOnlyPublishes: UInt64 = 0
    /// Publishes whose connection broke before Redis answered: they may or may not have been delivered.
    public var uncertainPublishes: UInt64 = 0
    /// Events found in the history after the notification connection was cut, and delivered late.
    public var recoveredAfterCut: UInt64 = 0
    /// Positions that went by while the notification connection was cut and that the history no longer held
    /// (an upper bound of what this node's subscribers missed).
    public var missedAfterCut: UInt64 = 0
    /// Sessions that came from a node that did not hand their queue over in time.
    public var abandonedHandoffs: UInt64 = 0
    /// Sessions moved to this node.
    public var claims: UInt64 = 0
    /// Sessions expired by this node's sweeps (for the whole cluster).
    public var sweptSessions: UInt64 = 0
    /// Events received from Redis (one per publish that has a subscriber here, whatever their number).
    public var eventsReceived: UInt64 = 0
    /// Sessions of this node that Redis no longer had when the node put them back after a reconnect (Redis
    /// restarted empty, or a Sentinel failover promoted a replica that had not received them).
    public var sessionsRestored: UInt64 = 0
    /// Sentinel: new masters this node moved to.
    public var failovers: UInt64 = 0
    /// Sentinel: publishes of this node that were acknowledged by the old master but that the new master does
    /// not have (not replicated in time): gone from the history, though delivered when they were published.
    public var failoverLostPublishes: UInt64 = 0
    /// Sentinel: positions this node had seen (delivered or published) beyond the new master's last one.
    public var failoverLostPositions: UInt64 = 0
}

/// The clustered engine: sessions, subscriptions and routing live in Redis, so every node sees every session;
/// each session's queue and connection live on one node (its home), in a local `MemoryEngine`.
///
/// A publish is one script run: it takes the next position, appends the event to the shared history, and
/// sends one notification per node that has a subscriber (not one per recipient). The node fans the event out
/// to its own sessions. A session whose client connects to another node moves there: routing moves in the same
/// script, and the old node hands the queue over, so nothing is lost or reordered. See `RedisScripts`.
public final class RedisEngine: Engine, @unchecked Sendable {
    public let configuration: BrokerConfiguration
    public let settings: RedisEngineConfiguration
    public var node: String { settings.nodeID }
    let local: MemoryEngine
    let commands: RedisClient
    var subscriber: RedisClient!
    /// Sentinel mode: finds the master and watches for failovers.
    let sentinel: SentinelMonitor?
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

    struct State {
        var epoch: UInt64?
        /// The key of the position permutation in Redis, learnt with the epoch (a publish, a history read).
        var positionKey: PositionKey?
        var lastSequence: UInt64 = 0
        var published: UInt64 = 0
        /// Highest position delivered from notifications, in `deliveredEpoch`.
        var delivered: UInt64 = 0
        var deliveredEpoch: String?
        /// The notification channel is subscribed.
        var subscribed = false
        /// This node's sessions and routing are in Redis since the command connection last came up.
        var routed = false
        /// Notifications are held back (from a disconnect until the history has been read after both
        /// connections are back), so that what the history gives and what arrives live merge in order.
        var filling = true
        var fillRunning = false
        var buffered: [NodeMessage] = []
        var adoptWaiters: [String: [EventLoopPromise<Void>]] = [:]
        var handoffWaiters: [String: EventLoopPromise<Void>] = [:]
        var abandoned: Set<String> = []
        var barriers: [UInt64: EventLoopPromise<Void>] = [:]
        var nextBarrier: UInt64 = 0
        var outageSince: NIODeadline?
        var outageLocalPublishes: UInt64 = 0
        var pendingDestroys: [(String, DetachReason)] = []
        /// Sentinel: the master this node's positions come from (set at each connection, see `reseat`).
        var termMaster: RedisEndpoint?
        /// Sentinel: the positions of this node's acknowledged publishes since `termMaster` (the newest, bounded),
        /// to count those a new master lacks.
        var acknowledged = CircularBuffer<UInt64>(initialCapacity: 64)
        var redis = RedisEngineStatistics()
        var closed = false
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
        self.local = MemoryEngine(configuration: localConfiguration)
        self.group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        self.keyPrefix = settings.keyPrefix
        self.channelPrefix = settings.keyPrefix + String(settings.redis.database) + ":"
        self.notificationChannel = channelPrefix + "n:" + settings.nodeID
        self.positionMarker = "pos" + ClientID.random()
        var wall = timespec()
        clock_gettime(CLOCK_REALTIME, &wall)
        let wallMilliseconds = Int64(wall.tv_sec) * 1000 + Int64(wall.tv_nsec) / 1_000_000
        self.wallOffsetMilliseconds = wallMilliseconds - Int64(NIODeadline.now().uptimeNanoseconds / 1_000_000)
        let loop = group.next()
        let setup = RedisScripts.all.map { RESPCommand("SCRIPT", "LOAD", .string($0.source)) }
        let box = NIOLockedValueBox<RedisEngine?>(nil)
        let sentinel = settings.sentinel.map { sentinelSettings in
            SentinelMonitor(settings: sentinelSettings, eventLoop: loop, logger: logger) { why in
                box.withLockedValue { $0 }?.rediscover(because: why)
            }
        }
        self.sentinel = sentinel
        var resolve: (@Sendable () -> EventLoopFuture<RedisEndpoint>)?
        var verifyCommands: (@Sendable (RedisEndpoint, @escaping RedisClient.Sender) -> EventLoopFuture<Void>)?
        var verifySubscriber: (@Sendable (RedisEndpoint, @escaping RedisClient.Sender) -> EventLoopFuture<Void>)?
        var onReadOnly: (@Sendable () -> Void)?
        if let monitor = sentinel {
            resolve = { monitor.resolve() }
            verifyCommands = { endpoint, send in
                monitor.verify(endpoint, send: send).flatMap { _ -> EventLoopFuture<Void> in
                    guard let engine = box.withLockedValue({ $0 }) else { return loop.makeSucceededVoidFuture() }
                    return engine.reseat(at: endpoint, send: send)
                }
            }
            verifySubscriber = { endpoint, send in monitor.verify(endpoint, send: send).map { _ in } }
            onReadOnly = { monitor.readOnly() }
        }
        self.commands = RedisClient(
            configuration: settings.redis, eventLoop: loop, name: "commands", setup: setup, logger: logger,
            resolve: resolve, verify: verifyCommands, onReadOnly: onReadOnly,
            onEvent: { event in box.withLockedValue { $0 }?.commandsEvent(event) })
        self.subscriber = RedisClient(
            configuration: settings.redis, eventLoop: loop, name: "notifications", logger: logger,
            resolve: resolve, verify: verifySubscriber,
            onPush: { push in box.withLockedValue { $0 }?.received(push) },
            onEvent: { event in box.withLockedValue { $0 }?.subscriberEvent(event) })
        box.withLockedValue { $0 = self }
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

    /// Both connections are up and this node receives its notifications.
    public var isReady: Bool {
        commands.isConnected && subscriber.isConnected
            && state.withLockedValue { $0.subscribed && $0.routed && !$0.filling }
    }

    public var redisStatistics: RedisEngineStatistics { state.withLockedValue { $0.redis } }

    /// Where Redis is, for logs: the URL (without password), or the sentinels and the master's name.
    public var redisDescription: String {
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
            counter("local_only_publishes", s.localOnlyPublishes,
                    "Publishes made while Redis was unreachable, delivered to this node's subscribers only."),
            counter("uncertain_publishes", s.uncertainPublishes,
                    "Publishes whose Redis connection broke before the answer: delivered or not."),
            counter("recovered_after_cut", s.recoveredAfterCut,
                    "Events found in the history after the notification connection was cut, delivered late."),
            counter("missed_after_cut", s.missedAfterCut,
                    "Positions the history no longer held after a notification cut (an upper bound of what was missed)."),
            counter("abandoned_handoffs", s.abandonedHandoffs,
                    "Sessions taken over from a node that did not hand their queue over in time."),
            counter("claims", s.claims, "Sessions moved to this node."),
            counter("swept_sessions", s.sweptSessions, "Sessions expired by this node's sweeps."),
            counter("events_received", s.eventsReceived, "Events received from Redis for this node's subscribers."),
            counter("sessions_restored", s.sessionsRestored,
                    "Sessions of this node that Redis no longer had after a reconnect or failover, put back."),
            counter("failovers", s.failovers, "Sentinel: new Redis masters this node moved to."),
            counter("failover_lost_publishes", s.failoverLostPublishes,
                    "Sentinel: this node's acknowledged publishes that the new master does not have (not replicated)."),
            counter("failover_lost_positions", s.failoverLostPositions,
                    "Sentinel: positions this node had seen beyond the new master's last one at a failover."),
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
    func eval(_ script: RedisScripts.Script, _ arguments: [RESPArgument]) -> EventLoopFuture<RESPValue> {
        let common: [RESPArgument] = [0, .string(keyPrefix), .string(channelPrefix)]
        let commands = self.commands
        return commands.send(RESPCommand(["EVALSHA", .string(script.sha)] + common + arguments)).flatMapError {
            error in
            if let e = error as? RedisError, e.code == .server, e.message.hasPrefix("NOSCRIPT") {
                return commands.send(RESPCommand(["EVAL", .string(script.source)] + common + arguments))
            }
            return commands.eventLoop.makeFailedFuture(error)
        }
    }

    var isConnected: Bool { commands.isConnected }

    // MARK: Engine

    public func createClient(now: NIODeadline, user: String?, on loop: any EventLoop) -> EventLoopFuture<String> {
        create(now: now, on: loop).flatMap { id in
            // The user is stored before the handshake is answered or reported, so every node sees it at once.
            let stored = user.map { self.setUser(id, user: $0, on: loop) } ?? loop.makeSucceededVoidFuture()
            return stored.recover { _ in }.map {
                self.report([SessionEvent(kind: .handshake, clientId: id, user: user)])
                return id
            }
        }
    }

    private func create(now: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<String> {
        let id = ClientID.random()
        local.adopt(id, subscriptions: [], connectedOnce: false, now: now)
        guard isConnected else {
            // Registered in Redis when it is back (see `resynchronise`).
            return loop.makeSucceededFuture(id)
        }
        return eval(RedisScripts.create, [.string(id), .string(node), expiry(now)]).flatMap { reply in
            let values = reply.array ?? []
            if values.first?.int != 1 {
                self.local.evict(id, reason: .superseded)
                return self.create(now: now, on: loop)
            }
            if values.count > 3 {
                self.learn(
                    sequence: values[1].string.flatMap { UInt64($0) }, epoch: values[2].string.flatMap { UInt64($0) },
                    key: values[3].string.flatMap { PositionKey(text: $0) })
            }
            self.noteCreated(id, now: now)
            return loop.makeSucceededFuture(id)
        }.recover { _ in id }.hop(to: loop)
    }

    public func clientExists(_ clientId: String, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        if local.hasSession(clientId) { return loop.makeSucceededFuture(true) }
        return commands.send(RESPCommand("ZSCORE", .string(keyPrefix + "clients"), .string(clientId)))
            .map { !$0.isNull }.hop(to: loop)
    }

    public func connect(_ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, on loop: any EventLoop)
        -> EventLoopFuture<ConnectResult>
    {
        residentOrClaimed(clientId, now: now, refresh: true, on: loop).flatMap { status in
            guard status == .ok else { return self.refusedConnect(clientId, status: status, on: loop) }
            return self.local.connect(clientId, now: now, sink: sink, on: loop)
        }
    }

    public func attach(_ clientId: String, sink: any DeliverySink, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        residentOrClaimed(clientId, now: .now(), refresh: false, on: loop).flatMap { status in
            guard status == .ok else { return loop.makeSucceededFuture(false) }
            return self.local.attach(clientId, sink: sink, on: loop)
        }
    }

    public func detach(_ clientId: String, sink: any DeliverySink, takeEvents: Bool) -> CircularBuffer<ByteBuffer> {
        local.detach(clientId, sink: sink, takeEvents: takeEvents)
    }

    /// Makes sure the session lives on this node, moving it here if another node holds it.
    func residentOrClaimed(_ clientId: String, now: NIODeadline, refresh: Bool, on loop: any EventLoop)
        -> EventLoopFuture<ConnectResult.Status>
    {
        let resident = local.hasSession(clientId)
        guard isConnected else {
            if resident { return loop.makeSucceededFuture(.ok) }
            return loop.makeFailedFuture(RedisError(.notConnected))
        }
        guard resident else { return claim(clientId, now: now, refresh: refresh).hop(to: loop) }
        let arguments: [RESPArgument] = [.string(clientId), .string(node), expiry(now), refresh ? "1" : "0"]
        return eval(RedisScripts.touch, arguments).flatMap { reply -> EventLoopFuture<ConnectResult.Status> in
            switch reply.array?.first?.int {
            case 1?:
                if self.local.hasSession(clientId) { return self.commands.eventLoop.makeSucceededFuture(.ok) }
                // Moved away and back between the check and now: fetch it again.
                return self.claim(clientId, now: now, refresh: refresh)
            case 3?:
                self.local.evict(clientId, reason: .superseded)
                return self.claim(clientId, now: now, refresh: refresh)
            case 2?:
                self.local.evict(clientId, reason: .overflow)
                return self.commands.eventLoop.makeSucceededFuture(.overflowed)
            default:
                self.local.evict(clientId, reason: .disconnected)
                return self.commands.eventLoop.makeSucceededFuture(.unknownClient)
            }
        }.flatMapError { error in
            // Redis went away mid-request: the local session goes on serving.
            if self.local.hasSession(clientId) { return self.commands.eventLoop.makeSucceededFuture(.ok) }
            return self.commands.eventLoop.makeFailedFuture(error)
        }.hop(to: loop)
    }

    /// Moves the session here: waits for the `A` notification (its subscriptions) and, when the old node is
    /// alive, for the queue it hands over.
    func claim(_ clientId: String, now: NIODeadline, refresh: Bool) -> EventLoopFuture<ConnectResult.Status> {
        let loop = commands.eventLoop
        let adopted = loop.makePromise(of: Void.self)
        let handedOver = loop.makePromise(of: Void.self)
        state.withLockedValue { s in
            s.adoptWaiters[clientId, default: []].append(adopted)
            s.handoffWaiters[clientId]?.succeed(())
            s.handoffWaiters[clientId] = handedOver
            s.abandoned.remove(clientId)
        }
        let arguments: [RESPArgument] = [.string(clientId), .string(node), expiry(now), refresh ? "1" : "0"]
        return eval(RedisScripts.claim, arguments).flatMap { reply -> EventLoopFuture<ConnectResult.Status> in
            let values = reply.array ?? []
            guard values.first?.int == 1 else {
                self.state.withLockedValue { s in
                    s.adoptWaiters[clientId]?.removeAll { $0.futureResult === adopted.futureResult }
                    if s.handoffWaiters[clientId]?.futureResult === handedOver.futureResult {
                        s.handoffWaiters[clientId] = nil
                    }
                }
                adopted.succeed(())
                handedOver.succeed(())
                return loop.makeSucceededFuture(values.first?.int == 2 ? .overflowed : .unknownClient)
            }
            let old = values.count > 1 ? values[1].string ?? "" : ""
            let oldAlive = values.count > 2 && (values[2].int ?? 0) > 0
            self.state.withLockedValue { $0.redis.claims += 1 }
            var waits = [self.bounded(adopted.futureResult, by: self.settings.redis.commandTimeout) {
                RedisError(.timeout, "session \(clientId) was not adopted")
            }]
            if old != self.node && !old.isEmpty && oldAlive {
                waits.append(self.bounded(handedOver.futureResult, by: self.settings.handoffTimeout) {
                    self.state.withLockedValue { s in
                        if s.handoffWaiters[clientId]?.futureResult === handedOver.futureResult {
                            s.handoffWaiters[clientId] = nil
                            // Remembered so a late handoff is dropped, not put before newer events; bounded.
                            if s.abandoned.count >= 10_000 { s.abandoned.removeAll() }
                            s.abandoned.insert(clientId)
                            s.redis.abandonedHandoffs += 1
                        }
                    }
                    self.logger.warning(
                        "no handoff from the former node in time; its queued events are lost",
                        metadata: ["pubsub.client.id": "\(clientId)", "pubsub.redis.node": "\(old)"])
                    return nil
                })
            } else {
                self.state.withLockedValue { s in
                    if s.handoffWaiters[clientId]?.futureResult === handedOver.futureResult {
                        s.handoffWaiters[clientId] = nil
                    }
                }
                handedOver.succeed(())
            }
            return EventLoopFuture.andAllSucceed(waits, on: loop).map { .ok }
        }
    }

    /// `future`, or after `timeout` what `onTimeout` says: an error to fail with, or nil to go on.
    func bounded(_ future: EventLoopFuture<Void>, by timeout: TimeAmount, onTimeout: @escaping @Sendable () -> (any Error)?)
        -> EventLoopFuture<Void>
    {
        let loop = commands.eventLoop
        let promise = loop.makePromise(of: Void.self)
        let timer = loop.scheduleTask(in: timeout) {
            if let error = onTimeout() { promise.fail(error) } else { promise.succeed(()) }
        }
        future.whenComplete { result in
            timer.cancel()
            promise.completeWith(result)
        }
        return promise.futureResult
    }

    public func subscribe(
        _ clientId: String, to channels: [String], resume: String?, now: NIODeadline, on loop: any EventLoop
    ) -> EventLoopFuture<(SubscriptionResult, ResumeResult?)> {
        let historyOn = configuration.historySize > 0
        guard isConnected else {
            guard local.hasSession(clientId) else { return loop.makeFailedFuture(RedisError(.notConnected)) }
            return local.subscribe(clientId, to: channels, resume: nil, now: now, on: loop).map { result, _ in
                self.reportSubscribed(clientId, channels, result)
                return (result, resume.map { _ in ResumeResult(recovered: false, missed: 0) })
            }
        }
        var arguments: [RESPArgument] = [
            .string(clientId), .integer(Int64(configuration.maxSubscriptionsPerClient)),
            .integer(Int64(channels.count)),
        ]
        arguments += channels.map { .string($0) }
        if let resume, historyOn {
            // Redis holds the key: the node passes the token's parts, the script undoes the permutation.
            let parsed = Position.parse(resume)
            arguments += [
                "1",
                .string(parsed.map { String($0.epoch) } ?? "-1"),
                .integer(Int64(parsed.map { $0.permuted >> 32 } ?? 0)),
                .integer(Int64(parsed.map { $0.permuted & 0xffff_ffff } ?? 0)),
                .integer(Int64(configuration.maxQueue)),
                .integer(configuration.historyTTL.map { $0.nanoseconds / 1_000_000 } ?? 0),
                .integer(milliseconds(now)),
            ]
        } else {
            arguments += ["0"]
        }
        return eval(RedisScripts.subscribe, arguments).map { reply -> (SubscriptionResult, ResumeResult?) in
            let values = reply.array ?? []
            switch values.first?.int {
            case 1?:
                let limit = values.count > 1 ? values[1].string ?? "" : ""
                var resumed: ResumeResult?
                if resume != nil {
                    resumed =
                        historyOn && values.count > 3
                        ? ResumeResult(recovered: values[2].int == 1, missed: Int(values[3].int ?? 0))
                        : ResumeResult(recovered: false, missed: 0)
                }
                let result: SubscriptionResult = limit.isEmpty ? .ok : .limitReached(limit)
                self.reportSubscribed(clientId, channels, result)
                return (result, resumed)
            case 2?: return (.overflowed, nil)
            default: return (.unknownClient, nil)
            }
        }.hop(to: loop)
    }

    public func unsubscribe(_ clientId: String, from channels: [String], on loop: any EventLoop)
        -> EventLoopFuture<SubscriptionResult>
    {
        guard isConnected else {
            guard local.hasSession(clientId) else { return loop.makeFailedFuture(RedisError(.notConnected)) }
            return local.unsubscribe(clientId, from: channels, on: loop).map { result in
                self.reportUnsubscribed(clientId, channels, result)
                return result
            }
        }
        let arguments: [RESPArgument] = [.string(clientId), .integer(Int64(channels.count))] + channels.map { .string($0) }
        return eval(RedisScripts.unsubscribe, arguments).map { reply -> SubscriptionResult in
            switch reply.array?.first?.int {
            case 1?:
                self.reportUnsubscribed(clientId, channels, .ok)
                return .ok
            case 2?: return .overflowed
            default: return .unknownClient
            }
        }.hop(to: loop)
    }

    public func destroyClient(_ clientId: String, reason: DetachReason, on loop: any EventLoop)
        -> EventLoopFuture<Bool>
    {
        let wasLocal = local.evict(clientId, reason: reason) != nil
        if reason == .kicked { rememberKicked(clientId) }
        guard isConnected else {
            guard wasLocal else { return loop.makeFailedFuture(RedisError(.notConnected)) }
            state.withLockedValue { $0.pendingDestroys.append((clientId, reason)) }
            reportEnded([clientId], reason)
            return loop.makeSucceededFuture(true)
        }
        return destroyInRedis(clientId, reason: reason).map { destroyed in
            if destroyed || wasLocal { self.reportEnded([clientId], reason) }
            return destroyed || wasLocal
        }.hop(to: loop)
    }

    func destroyInRedis(_ clientId: String, reason: DetachReason) -> EventLoopFuture<Bool> {
        eval(RedisScripts.destroy, [.string(clientId), .string(Self.name(of: reason)), .integer(lifetimeMilliseconds)])
            .map { $0.int == 1 }
    }

    static func name(of reason: DetachReason) -> String {
        switch reason {
        case .superseded: return "superseded"
        case .disconnected: return "disconnected"
        case .expired: return "expired"
        case .overflow: return "overflow"
        case .shutdown: return "shutdown"
        case .kicked: return "kicked"
        }
    }

    static func reason(named name: String) -> DetachReason {
        switch name {
        case "expired": return .expired
        case "overflow": return .overflow
        case "superseded": return .superseded
        case "shutdown": return .shutdown
        case "kicked": return .kicked
        default: return .disconnected
        }
    }

    public func publish(_ message: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<String?>
    {
        guard isConnected else {
            publishLocally(message, to: channel)
            return loop.makeSucceededFuture(nil)
        }
        let keys = Channel.expand(channel)
        var head: ByteBuffer
        var tail = ByteBuffer()
        if configuration.historySize > 0 {
            var positioned = message
            switch positioned.fields["ext"] {
            case nil, .null?: positioned.fields["ext"] = .object(["position": .string(positionMarker)])
            case .object(var ext)?:
                ext["position"] = .string(positionMarker)
                positioned.fields["ext"] = .object(ext)
            default: break
            }
            head = positioned.encodedEvent()
            if let at = Self.find(positionMarker, in: head) {
                tail = head.getSlice(at: at + positionMarker.utf8.count, length: head.writerIndex - at - positionMarker.utf8.count)!
                head.moveWriterIndex(to: at)
            }
        } else {
            head = message.encodedEvent()
        }
        var arguments: [RESPArgument] = [
            .string(String(epochCandidate)), .string(positionKeyCandidate), .integer(Int64(configuration.historySize)),
            .integer(Int64(configuration.historyBytes)), .string(channel),
            .bytes(head), .bytes(tail), .integer(milliseconds(now)), .integer(Int64(keys.count)),
        ]
        arguments += keys.map { .string($0) }
        return eval(RedisScripts.publish, arguments).map { reply -> String? in
            let values = reply.array ?? []
            let sequence = values.first?.int.map { UInt64($0) } ?? 0
            let epoch = values.count > 1 ? values[1].string.flatMap { UInt64($0) } : nil
            let key = values.count > 2 ? values[2].string.flatMap { PositionKey(text: $0) } : nil
            self.state.withLockedValue { s in
                s.published += 1
                if self.sentinel != nil, sequence > 0 {
                    if s.acknowledged.count >= 100_000 { s.acknowledged.removeFirst() }
                    s.acknowledged.append(sequence)
                }
            }
            self.learn(sequence: sequence, epoch: epoch, key: key)
            guard self.configuration.historySize > 0, let epoch else { return nil }
            // The token the script wrote into the event: the permutation of this publish's sequence.
            let positionKey = key ?? self.state.withLockedValue { $0.positionKey }
            return positionKey.map { Position(epoch: epoch, sequence: sequence).token(key: $0) }
        }.flatMapErrorThrowing { error -> String? in
            if let e = error as? RedisError, e.code == .notConnected {
                // Never sent: the connection went down just before.
                self.publishLocally(message, to: channel)
                return nil
            }
            self.state.withLockedValue { $0.redis.uncertainPublishes += 1 }
            throw error
        }.hop(to: loop)
    }

    /// Redis is away: this node's subscribers get the event now; other nodes never will (counted, logged).
    func publishLocally(_ message: Message, to channel: String) {
        dropOverflowed(local.enqueue(message.encodedEvent(), on: channel))
        state.withLockedValue { s in
            s.published += 1
            s.redis.localOnlyPublishes += 1
            s.outageLocalPublishes += 1
        }
    }

    static func find(_ marker: String, in buffer: ByteBuffer) -> Int? {
        let needle = Array(marker.utf8)
        let view = buffer.readableBytesView
        guard view.count >= needle.count else { return nil }
        var i = view.startIndex
        let last = view.endIndex - needle.count
        while i <= last {
            if view[i] == needle[0], view[i..<(i + needle.count)].elementsEqual(needle) {
                return buffer.readerIndex + (i - view.startIndex)
            }
            i += 1
        }
        return nil
    }

    /// Clients whose local queue overflowed: dropped locally already, now in Redis too.
    func dropOverflowed(_ ids: [String]) {
        guard !ids.isEmpty else { return }
        reportEnded(ids, .overflow)
        for id in ids {
            if isConnected {
                _ = destroyInRedis(id, reason: .overflow)
            } else {
                state.withLockedValue { $0.pendingDestroys.append((id, .overflow)) }
            }
        }
    }

    public func sweep(now: NIODeadline) {
        _ = sweepNow(now: now)
    }

    /// The sweep, completing when Redis has answered (tests).
    public func sweepNow(now: NIODeadline) -> EventLoopFuture<Void> {
        guard isConnected else {
            // Nobody can sweep the cluster meanwhile: this node expires its own sessions.
            local.sweep(now: now)
            return commands.eventLoop.makeSucceededVoidFuture()
        }
        // A silent network cut shows on the notification connection only when something waits for an answer.
        subscriber.send([RESPCommand("PING")]).whenFailure { _ in }
        let period = settings.sweepPeriod.nanoseconds / 1_000_000
        let heartbeat = max(3 * period, 3000)
        let commands: [RESPCommand] = [
            RESPCommand("SET", .string(keyPrefix + "alive:" + node), "1", "PX", .integer(heartbeat)),
            RESPCommand("GET", .string(keyPrefix + "seq")),
        ]
        return self.commands.send(commands)
            .and(eval(RedisScripts.sweep, [.string(node), .integer(milliseconds(now)), .integer(period), .integer(Int64(settings.sweepBatch))]))
            .map { replies, swept in
                let seq = replies.count > 1 ? replies[1].int.map { UInt64($0) } : nil
                // The ids this sweep expired (older scripts answered with their number only).
                let expired = swept.array?.compactMap(\.string) ?? []
                let count = swept.array.map { Int64($0.count) } ?? swept.int
                self.state.withLockedValue { s in
                    if let seq { s.lastSequence = max(s.lastSequence, seq) }
                    if let n = count, n > 0 { s.redis.sweptSessions += UInt64(n) }
                }
                self.reportEnded(expired, .expired)
                if let n = count, n > 0 {
                    self.logger.debug("expired sessions", metadata: ["pubsub.redis.expired": "\(n)"])
                }
            }
    }

    /// Completes once every notification sent to this node before the call has been handled, and the deliveries
    /// it caused have been handed to their sinks' event loops.
    public func settle() -> EventLoopFuture<Void> {
        let loop = commands.eventLoop
        let promise = loop.makePromise(of: Void.self)
        let n = state.withLockedValue { s -> UInt64 in
            s.nextBarrier += 1
            s.barriers[s.nextBarrier] = promise
            return s.nextBarrier
        }
        commands.send(RESPCommand("PUBLISH", .string(notificationChannel), .bytes(NodeMessage.barrier(n).encoded())))
            .whenFailure { error in
                self.state.withLockedValue { $0.barriers[n] = nil }
                promise.fail(error)
            }
        return promise.futureResult
    }

    public func shutdown() {
        local.shutdown()
        let closed = state.withLockedValue { s -> Bool in
            defer { s.closed = true }
            return s.closed
        }
        guard !closed else { return }
        let group = self.group
        let subscriber = self.subscriber!
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

    /// Closes the Redis connections and stops the engine's thread (tests; `shutdown` does it too).
    public func close() async {
        local.shutdown()
        let closed = state.withLockedValue { s -> Bool in
            defer { s.closed = true }
            return s.closed
        }
        guard !closed else { return }
        _ = try? await sentinel?.close().get()
        _ = try? await commands.close().and(subscriber.close()).get()
        try? await group.shutdownGracefully()
    }
}
