import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

/// One service spread over several shards of a Redis Cluster (`--redis-shards N`): N Redis engines, each under a
/// hash tag of its own (so on a master of its own), each with its own positions, history, routing, notification
/// connections and failover handling. A publish runs in the shard of its channel only (`ShardMap`), so publishing
/// scales with the masters.
///
/// A session lives in every shard: shard 0 holds all of it (user, grant, every subscription, presence, webhook
/// events), each other shard the subscriptions of its channels and the session's queue of its events. A connect
/// goes to every shard (each moves the session to this node on its own, handing its queue over as without
/// shards) and their answers are merged; a sink is attached to every shard through a `ShardFanIn`.
///
/// What differs from one engine (docs/CLUSTER.md): order is kept per shard, not across shards; the queue bound
/// (`--max-queue`) applies per shard; a position names one shard, so a resume covers a subscription held by one
/// shard, or all of them from the handshake's position (one part per shard).
public final class RedisShardedEngine: Engine, EngineQueries, EngineObservability, Sendable {
    public let configuration: BrokerConfiguration
    public let map: ShardMap
    public let shards: [RedisEngine]
    let logger: Logger
    let fanIns = NIOLockedValueBox<[String: ShardFanIn]>([:])

    var control: RedisEngine { shards[0] }

    public init(
        configuration: BrokerConfiguration,
        settings: RedisEngineConfiguration,
        map: ShardMap,
        logger: Logger = Logger(label: "pubsub.redis"),
        events: (any SessionEventObserver)? = nil
    ) {
        self.configuration = configuration
        self.map = map
        self.logger = logger
        let box = NIOLockedValueBox<RedisShardedEngine?>(nil)
        shards = map.prefixes.enumerated().map { k, prefix in
            var shardSettings = settings
            shardSettings.keyPrefix = prefix
            var shardLogger = logger
            shardLogger[metadataKey: "pubsub.redis.shard"] = "\(k)"
            // Shard 0 reports the session's events; the others only tell this engine of an overflow, so that the
            // session ends everywhere.
            let observer: (any SessionEventObserver)? =
                k == 0 ? events : OverflowObserver { ids in box.withLockedValue { $0 }?.overflowed(ids, in: k) }
            return RedisEngine(
                configuration: configuration, settings: shardSettings, logger: shardLogger, events: observer)
        }
        box.withLockedValue { $0 = self }
    }

    /// Connects every shard; completes when all are up, or fails after `timeout` (they keep trying).
    @discardableResult
    public func start(timeout: TimeAmount = .seconds(5)) -> EventLoopFuture<Void> {
        let loop = control.commands.eventLoop
        return EventLoopFuture.andAllSucceed(shards.map { $0.start(timeout: timeout) }, on: loop)
    }

    public var redisDescription: String {
        control.redisDescription + " in \(map.count) shards ("
            + map.prefixes.map { "\($0) slot \(ClusterSlot.of($0))" }
            .joined(separator: ", ") + ")"
    }

    public var isReady: Bool { shards.allSatisfy(\.isReady) }

    /// The first shard's that is not ready, named by its place in `--redis-shards`.
    public var readinessNote: String? {
        for (index, shard) in shards.enumerated() where !shard.isReady {
            return "shard \(index + 1): " + (shard.readinessNote ?? "not ready")
        }
        return nil
    }

    public var statistics: EngineStatistics {
        var s = control.statistics
        for shard in shards.dropFirst() {
            let d = shard.statistics
            s.published += d.published
            s.queued += d.queued
            s.overflowDrops += d.overflowDrops
            s.resent += d.resent
            s.queueDepth += d.queueDepth
        }
        return s
    }

    /// Every shard's counters, summed.
    public var extraMetrics: [EngineMetric] {
        var metrics = control.extraMetrics
        for shard in shards.dropFirst() {
            for (i, metric) in shard.extraMetrics.enumerated() where i < metrics.count && metrics[i].name == metric.name
            {
                metrics[i].value += metric.value
            }
        }
        return metrics
    }

    public var redisStatistics: [RedisEngineStatistics] { shards.map(\.redisStatistics) }

    /// The handshake's position: one part per shard.
    public var position: String? {
        guard configuration.historySize > 0 else { return nil }
        var tokens: [String] = []
        for shard in shards {
            guard let token = shard.position else { return nil }
            tokens.append(token)
        }
        return map.vector(tokens)
    }

    // MARK: Sessions

    public func createClient(now: NIODeadline, user: String?, on loop: any EventLoop) -> EventLoopFuture<String> {
        control.createClient(now: now, user: user, on: loop).flatMap { id in
            let created = self.shards.dropFirst().map { $0.createSession(id, now: now) }
            return EventLoopFuture.whenAllComplete(created, on: loop).map { _ in id }
        }
    }

    public func clientExists(_ clientId: String, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        control.clientExists(clientId, on: loop)
    }

    /// Every shard keeps the ledger of what it handed to the connection (through its proxy), and every connect and
    /// every closed batch reaches every shard, so their batch numbers stay the same: the first shard's is the one.
    public func closeBatch(_ clientId: String, connectId: JSONValue?) -> UInt64? {
        var batch: UInt64?
        for shard in shards {
            let closed = shard.closeBatch(clientId, connectId: connectId)
            batch = batch ?? closed
        }
        return batch
    }

    public func connect(
        _ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt, on loop: any EventLoop
    ) -> EventLoopFuture<ConnectResult> {
        guard let sink else {
            let connects = shards.map { $0.connect(clientId, now: now, sink: nil, receipt: receipt, on: loop) }
            return EventLoopFuture.whenAllSucceed(connects, on: loop).flatMap { results in
                self.merged(clientId, results, fanIn: nil, on: loop) { result in
                    result.events = Self.events(of: results)
                    result.answerNow = true
                }
            }
        }
        if let fanIn = attached(clientId, sink: sink), case let proxies = fanIn.all, proxies.count == shards.count {
            // The connection's next connect (a WebSocket's, every timeout): the same proxies again, so that no
            // shard takes it for another connection superseding this one.
            let connects = shards.enumerated().map { k, shard in
                shard.connect(clientId, now: now, sink: proxies[k], receipt: receipt, on: loop)
            }
            return EventLoopFuture.whenAllSucceed(connects, on: loop).flatMap { results in
                self.merged(clientId, results, fanIn: fanIn, on: loop) { result in
                    result.events = Self.events(of: results)
                    result.attached = results.allSatisfy(\.attached)
                    result.answerNow = results.contains { $0.answerNow }
                }
            }
        }
        let fanIn = ShardFanIn(engine: self, clientId: clientId, sink: sink, shards: shards.count)
        fanIns.withLockedValue { $0[clientId] = fanIn }
        let proxies = fanIn.all
        let connects = shards.enumerated().map { k, shard in
            shard.connect(clientId, now: now, sink: proxies[k], receipt: receipt, on: loop)
        }
        return EventLoopFuture.whenAllComplete(connects, on: loop).flatMap { outcomes in
            var results: [ConnectResult] = []
            for outcome in outcomes {
                switch outcome {
                case .success(let result): results.append(result)
                case .failure(let error):
                    self.abandon(fanIn)
                    return loop.makeFailedFuture(error)
                }
            }
            return self.merged(clientId, results, fanIn: fanIn, on: loop) { result in
                var events = Self.events(of: results)
                let attachedEverywhere = results.allSatisfy(\.attached)
                let answerNow = results.contains { $0.answerNow } || !attachedEverywhere
                if sink.isPersistent {
                    let (early, armed) = fanIn.settle(attach: attachedEverywhere)
                    events.append(contentsOf: early)
                    result.attached = armed
                    result.answerNow = answerNow
                    if !armed { self.abandon(fanIn) }
                } else {
                    let (early, armed) = fanIn.settle(attach: !answerNow)
                    if !armed {
                        // Answered now: what every shard holds goes with it.
                        events.append(contentsOf: early)
                        events.append(contentsOf: self.detachProxies(of: fanIn, except: nil, takeEvents: true))
                        self.forget(fanIn)
                        result.attached = false
                        result.answerNow = true
                    } else {
                        result.attached = true
                        result.answerNow = false
                    }
                }
                result.events = events
            }
        }
    }

    /// Every shard's waiting events, shard after shard (in order within each).
    private static func events(of results: [ConnectResult]) -> CircularBuffer<WireEvent> {
        var events = CircularBuffer<WireEvent>()
        for r in results where !r.events.isEmpty { events.append(contentsOf: r.events) }
        return events.isEmpty ? .noEvents : events
    }

    /// The shards' answers as one: shard 0's refusal, or a refusal of another shard (a session that shard lost:
    /// it ends everywhere), or `fill` on shard 0's answer.
    private func merged(
        _ clientId: String, _ results: [ConnectResult], fanIn: ShardFanIn?, on loop: any EventLoop,
        fill: (inout ConnectResult) -> Void
    ) -> EventLoopFuture<ConnectResult> {
        if results[0].status != .ok {
            if let fanIn { abandon(fanIn) }
            // Gone from shard 0: gone from the others too (quietly: shard 0 reported it).
            let reason: DetachReason = results[0].status == .kicked ? .kicked : .expired
            for shard in shards.dropFirst() { _ = shard.destroyClient(clientId, reason: reason, on: loop) }
            return loop.makeSucceededFuture(ConnectResult(status: results[0].status))
        }
        if let refused = results.first(where: { $0.status != .ok }) {
            if let fanIn { abandon(fanIn) }
            let reason: DetachReason =
                switch refused.status {
                case .overflowed: .overflow
                case .kicked: .kicked
                default: .expired
                }
            logger.warning(
                "a shard no longer has the session: it ends everywhere",
                metadata: ["pubsub.client.id": "\(clientId)", "pubsub.redis.reason": "\(reason)"])
            return destroyClient(clientId, reason: reason, on: loop).map { _ in
                ConnectResult(status: refused.status == .overflowed ? .overflowed : .unknownClient)
            }
        }
        var result = results[0]
        fill(&result)
        return loop.makeSucceededFuture(result)
    }

    /// The fan-in that already carries `sink` (persistent, attached everywhere), if any.
    private func attached(_ clientId: String, sink: any DeliverySink) -> ShardFanIn? {
        guard sink.isPersistent else { return nil }
        return fanIns.withLockedValue { map in
            guard let fanIn = map[clientId], fanIn.sink === sink, fanIn.isArmed else { return nil }
            return fanIn
        }
    }

    public func attach(_ clientId: String, sink: any DeliverySink, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        if attached(clientId, sink: sink) != nil { return loop.makeSucceededFuture(true) }
        let fanIn = ShardFanIn(engine: self, clientId: clientId, sink: sink, shards: shards.count)
        fanIns.withLockedValue { $0[clientId] = fanIn }
        let proxies = fanIn.all
        let attaches = shards.enumerated().map { k, shard in shard.attach(clientId, sink: proxies[k], on: loop) }
        return EventLoopFuture.whenAllComplete(attaches, on: loop).map { outcomes in
            let ok = outcomes.allSatisfy { if case .success(true) = $0 { return true } else { return false } }
            guard ok else {
                self.abandon(fanIn)
                return false
            }
            let (early, armed) = fanIn.settle(attach: true)
            guard armed else {
                // Detached while attaching (superseded, ended): the sink has been told.
                self.abandon(fanIn)
                return false
            }
            if !early.isEmpty { sink.deliver(early) }
            return true
        }
    }

    public func detach(_ clientId: String, sink: any DeliverySink, takeEvents: Bool) -> CircularBuffer<WireEvent> {
        let fanIn = fanIns.withLockedValue { map -> ShardFanIn? in
            guard let fanIn = map[clientId], fanIn.sink === sink else { return nil }
            map[clientId] = nil
            return fanIn
        }
        guard let fanIn else { return .noEvents }
        var events = fanIn.close()
        events.append(contentsOf: detachProxies(of: fanIn, except: nil, takeEvents: takeEvents))
        if !takeEvents, !events.isEmpty {
            // Arrived while connecting, never handed over: queued again for the next connection.
            putBack(events, for: clientId, shard: 0)
            return .noEvents
        }
        return events
    }

    /// Detaches a fan-in's proxies from their shards (all but `except`), once; with `takeEvents`, what they held.
    func detachProxies(of fanIn: ShardFanIn, except: Int?, takeEvents: Bool) -> CircularBuffer<WireEvent> {
        var events = CircularBuffer<WireEvent>()
        for proxy in fanIn.takeProxies() where proxy.shard != except {
            events.append(contentsOf: shards[proxy.shard].detach(fanIn.clientId, sink: proxy, takeEvents: takeEvents))
        }
        return events
    }

    /// The fan-in no longer stands for the session's connection.
    func forget(_ fanIn: ShardFanIn) {
        fanIns.withLockedValue { map in
            if map[fanIn.clientId] === fanIn { map[fanIn.clientId] = nil }
        }
    }

    /// A connect that could not attach everywhere: nothing of it stays attached.
    func abandon(_ fanIn: ShardFanIn) {
        var events = fanIn.close()
        events.append(contentsOf: detachProxies(of: fanIn, except: nil, takeEvents: false))
        forget(fanIn)
        if !events.isEmpty { putBack(events, for: fanIn.clientId, shard: 0) }
    }

    /// Events a shard sent to a fan-in that had already answered: back at the front of that shard's queue.
    func putBack(_ events: CircularBuffer<WireEvent>, for clientId: String, shard: Int) {
        guard !events.isEmpty else { return }
        switch shards[shard].local.insert(events, into: clientId, resuming: nil) {
        case true?:
            break
        case false?:
            shards[shard].dropOverflowed([clientId])
        case nil:
            // The session left this node meanwhile (moved, ended): said, not silently dropped.
            logger.warning(
                "events for a session that left this node were not delivered",
                metadata: ["pubsub.client.id": "\(clientId)", "pubsub.redis.events": "\(events.count)"])
        }
    }

    /// A shard detached the session's connection: an overflow, a kick or an expiry there ends the session in
    /// every shard; a move to another node or a disconnect reaches every shard by itself.
    func detachedEverywhere(_ clientId: String, reason: DetachReason, from shard: Int) {
        switch reason {
        case .overflow, .kicked:
            endElsewhere(clientId, reason: reason, except: shard)
        case .superseded, .disconnected, .expired, .shutdown:
            break
        }
    }

    /// Sessions dropped for overflow by a shard other than 0 (no connection attached to them then), or by a
    /// fan-in (`shard` nil): they end in every shard, and shard 0 reports it.
    func overflowed(_ ids: [String], in shard: Int?) {
        for id in ids { endElsewhere(id, reason: .overflow, except: shard) }
    }

    private func endElsewhere(_ clientId: String, reason: DetachReason, except: Int?) {
        let loop = control.commands.eventLoop
        for (k, engine) in shards.enumerated() where k != except {
            _ = engine.destroyClient(clientId, reason: reason, on: loop)
        }
    }

    public func subscribe(
        _ clientId: String, to channels: [String], resume: String?, now: NIODeadline, on loop: any EventLoop
    ) -> EventLoopFuture<(SubscriptionResult, ResumeResult?)> {
        let placed = channels.map { map.shards(ofSubscription: $0) }
        let inControl = placed.contains { $0.contains(0) }
        // Shard 0 holds every subscription (the limit is checked there); it resumes only those it routes.
        return control.subscribe(
            clientId, to: channels, resume: inControl ? resume.map { map.component(of: $0, shard: 0) } : nil, now: now,
            on: loop
        ).flatMap { controlResult, controlResume in
            let applied: [Int]
            switch controlResult {
            case .ok: applied = Array(placed.indices)
            case .limitReached(let channel): applied = Array(placed.indices.prefix { channels[$0] != channel })
            case .unknownClient, .overflowed: return loop.makeSucceededFuture((controlResult, controlResume))
            }
            var work: [EventLoopFuture<(SubscriptionResult, ResumeResult?)>] = []
            for k in 1..<self.shards.count {
                let mine = applied.filter { placed[$0].contains(k) }.map { channels[$0] }
                guard !mine.isEmpty else { continue }
                work.append(
                    self.shards[k].subscribe(
                        clientId, to: mine, resume: resume.map { self.map.component(of: $0, shard: k) }, now: now,
                        on: loop))
            }
            return EventLoopFuture.whenAllSucceed(work, on: loop).map { results in
                var resumed = controlResume
                for (result, shardResume) in results {
                    if result == .overflowed || result == .unknownClient { return (result, nil) }
                    if let shardResume {
                        let before = resumed ?? ResumeResult(recovered: true, missed: 0)
                        resumed = ResumeResult(
                            recovered: before.recovered && shardResume.recovered,
                            missed: before.missed + shardResume.missed)
                    }
                }
                return (controlResult, resume == nil ? nil : resumed ?? ResumeResult(recovered: false, missed: 0))
            }
        }
    }

    public func unsubscribe(_ clientId: String, from channels: [String], on loop: any EventLoop)
        -> EventLoopFuture<SubscriptionResult>
    {
        control.unsubscribe(clientId, from: channels, on: loop).flatMap { result in
            guard result == .ok else { return loop.makeSucceededFuture(result) }
            var work: [EventLoopFuture<SubscriptionResult>] = []
            for k in 1..<self.shards.count {
                let mine = channels.filter { self.map.shards(ofSubscription: $0).contains(k) }
                if !mine.isEmpty { work.append(self.shards[k].unsubscribe(clientId, from: mine, on: loop)) }
            }
            return EventLoopFuture.whenAllComplete(work, on: loop).map { _ in result }
        }
    }

    public func destroyClient(_ clientId: String, reason: DetachReason, on loop: any EventLoop) -> EventLoopFuture<Bool>
    {
        control.destroyClient(clientId, reason: reason, on: loop).flatMap { existed in
            let others = self.shards.dropFirst().map { $0.destroyClient(clientId, reason: reason, on: loop) }
            return EventLoopFuture.whenAllComplete(others, on: loop).map { _ in existed }
        }
    }

    public func publish(_ event: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<String?>
    {
        shards[map.shard(ofChannel: channel)].publish(event, to: channel, now: now, on: loop)
    }

    public func setUser(_ clientId: String, user: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        control.setUser(clientId, user: user, on: loop)
    }

    public func user(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        control.user(of: clientId, on: loop)
    }

    public func setGrant(_ clientId: String, grant: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        control.setGrant(clientId, grant: grant, on: loop)
    }

    public func grant(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        control.grant(of: clientId, on: loop)
    }

    public func sweep(now: NIODeadline) {
        for shard in shards { shard.sweep(now: now) }
    }

    /// Sweeps every shard now (tests).
    public func sweepNow(now: NIODeadline) -> EventLoopFuture<Void> {
        EventLoopFuture.andAllSucceed(shards.map { $0.sweepNow(now: now) }, on: control.commands.eventLoop)
    }

    /// Every shard's notifications handled (tests).
    public func settle() -> EventLoopFuture<Void> {
        EventLoopFuture.andAllSucceed(shards.map { $0.settle() }, on: control.commands.eventLoop)
    }

    public func shutdown() {
        for shard in shards { shard.shutdown() }
    }

    public func close() async {
        for shard in shards { await shard.close() }
    }

    // MARK: The server API's questions: shard 0 holds every session and subscription.

    public func channels(on loop: any EventLoop) -> EventLoopFuture<[ChannelSubscribers]> {
        control.channels(on: loop)
    }

    public func presence(of channel: String, now: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<
        [PresenceEntry]
    > {
        control.presence(of: channel, now: now, on: loop)
    }

    /// The history of a channel, or of a pattern held by one shard, is that shard's; a pattern held by all of
    /// them gets every shard's page, shard after shard (order is kept within each).
    public func history(of channel: String, since: String?, limit: Int, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<HistoryPage>
    {
        let placed = map.shards(ofSubscription: channel)
        if case .one(let k) = placed {
            return shards[k].history(
                of: channel, since: since.map { map.component(of: $0, shard: k) }, limit: limit, now: now, on: loop)
        }
        let pages = shards.enumerated().map { k, shard in
            shard.history(
                of: channel, since: since.map { map.component(of: $0, shard: k) }, limit: limit, now: now, on: loop)
        }
        return EventLoopFuture.whenAllSucceed(pages, on: loop).map { pages in
            var merged = HistoryPage(events: [], recovered: true, truncated: false)
            for page in pages {
                merged.events += page.events.prefix(max(0, limit - merged.events.count))
                merged.recovered = merged.recovered && page.recovered
                merged.truncated = merged.truncated || page.truncated || page.events.count > limit
            }
            if merged.events.count >= limit, pages.reduce(0, { $0 + $1.events.count }) > limit {
                merged.truncated = true
            }
            return merged
        }
    }

    public func noteConnection(_ clientId: String, type: ConnectionType) {
        control.noteConnection(clientId, type: type)
    }

    public func nodes(local: NodeReport, on loop: any EventLoop) -> EventLoopFuture<[NodeReport]> {
        control.nodes(local: local, on: loop)
    }
}

/// Hears a shard's session events and passes on its overflows.
private final class OverflowObserver: SessionEventObserver, Sendable {
    let overflowed: @Sendable ([String]) -> Void

    init(_ overflowed: @escaping @Sendable ([String]) -> Void) {
        self.overflowed = overflowed
    }

    func sessionEvents(_ events: [SessionEvent]) {
        let ids = events.compactMap { $0.kind == .disconnect && $0.reason == .overflow ? $0.clientId : nil }
        if !ids.isEmpty { overflowed(ids) }
    }
}
