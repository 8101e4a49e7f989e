import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore

/// The in-process engine: every session, subscription and queue lives in this process.
///
/// The sessions are split by client id into shards (`Shard`, `MemoryEngine+Shard.swift`), each with its own lock,
/// subscription index and queues. The engine's own lock guards only what every publish shares: the order of
/// events (a ticket each), the history, and the count of publishes. A publish encodes (and compresses) its event
/// outside any lock, takes the engine lock once for its ticket and history entry, then each shard's lock in turn
/// to queue the same buffer for that shard's subscribers and collect the sinks to wake, grouped by event loop, so
/// each loop gets one task per publish burst (not one per recipient) and drains its sessions shard by shard.
///
/// Lock order: a shard's lock may be held while the engine lock is taken (a resuming subscribe reads the
/// history); never the other way round, and never two shards' locks at once.
// @unchecked: every `var` is guarded by `lock`; each shard's by its own.
public final class MemoryEngine: Engine, EngineObservability, @unchecked Sendable {
    /// Guarded by its shard's lock; handed between event loops only inside wake-up tasks.
    // @unchecked: guarded by its shard's `lock`; handed between event loops only inside wake-up tasks.
    final class Session: @unchecked Sendable {
        // Stored in this order, the one-byte fields in the padding after `subscriptions` (17 bytes), and `since`
        // without an optional's tag byte: 216 bytes, which malloc serves from its 224-byte chunks, not its 256.
        let id: String
        var subscriptions = SubscriptionSet()
        var wakeScheduled = false
        var connectedOnce = false
        /// The attached sink is an EventSource stream (`attach`): what it is handed is not kept in the ledger.
        var streaming = false
        /// For presence (`MemoryEngine+Presence.swift`): the latest connect's type; `since`, the handshake's time.
        var transport: ConnectionType?
        /// The number of its shard in `shards`.
        private let shardNumber: Int32
        var queue = SessionQueue()
        var expiresAt: NIODeadline
        var sink: (any DeliverySink)?
        /// What connections were handed and the client has not confirmed (`DeliveryLedger`).
        var ledger = DeliveryLedger()
        var stamp: UInt64 = 0
        /// The user an authorization mode established (JWT `sub`, the hook's handshake answer); see `setUser`.
        var user: String?
        /// What an authorization mode granted at the handshake (`SessionGrant.encoded`); see `setGrant`.
        var grant: String?
        /// `since`; zero until the handshake sets it.
        private var handshakeTime = NIODeadline.uptimeNanoseconds(0)

        var shard: Int { Int(shardNumber) }
        var since: NIODeadline? {
            get { handshakeTime == .uptimeNanoseconds(0) ? nil : handshakeTime }
            set { handshakeTime = newValue ?? .uptimeNanoseconds(0) }
        }

        init(id: String, shard: Int, expiresAt: NIODeadline) {
            self.id = id
            self.shardNumber = Int32(shard)
            self.expiresAt = expiresAt
        }
    }

    /// Guards `history`, `encoded`, `tickets` and `published`.
    let lock = NIOLock()
    /// A power of two of them, so that a client id's hash picks one with a mask.
    let shards: [Shard]
    var history: History
    /// Publishes encoded out of the lock, waiting for an earlier sequence to be queued first (`publish`).
    private var encoded: [UInt64: (event: WireEvent, channel: String, keys: [String], now: NIODeadline)] = [:]
    /// The last ticket handed out (`Shard`): every event queued, published here or handed over by another node.
    var tickets: UInt64 = 0
    private var published: UInt64 = 0
    /// Changes at every start: positions of an earlier run are never taken for positions in this one.
    package let epoch: UInt64
    /// The secret that makes positions opaque (`PositionCipher`); new at every start, like the epoch.
    package let positionKey: PositionKey

    public let configuration: BrokerConfiguration
    var lifetime: TimeAmount { configuration.timeout * 2 }

    /// Told about handshakes, subscriptions and ended sessions (webhooks); nil records nothing.
    private let observer: (any SessionEventObserver)?

    /// Says when a client with no connection attached is dropped for overflow (a polling client between two
    /// polls): no transport sees that drop, so the engine logs it. Drops of attached clients are logged by their
    /// connection.
    private let logger: Logger?

    /// The number of shards when none is given: four per core, at least four, a power of two. More shards make a
    /// wait on a busy one less likely; each publish visits every one.
    static var defaultShardCount: Int {
        var count = 4
        while count < System.coreCount * 4 && count < 256 { count *= 2 }
        return count
    }

    public convenience init(
        configuration: BrokerConfiguration, events observer: (any SessionEventObserver)? = nil, logger: Logger? = nil
    ) {
        self.init(
            configuration: configuration, epoch: .random(in: 1...(1 << 52)), positionKey: .random(), events: observer,
            logger: logger)
    }

    /// With a given epoch and position key: tests that compare positions across engines or runs. `shards` is
    /// rounded up to a power of two.
    package init(
        configuration: BrokerConfiguration, epoch: UInt64, positionKey: PositionKey = .random(),
        events observer: (any SessionEventObserver)? = nil,
        logger: Logger? = nil, shards: Int = MemoryEngine.defaultShardCount
    ) {
        self.logger = logger
        self.configuration = configuration
        self.history = History(
            capacity: configuration.historySize, maxBytes: configuration.historyBytes, maxAge: configuration.historyTTL)
        self.epoch = epoch
        self.positionKey = positionKey
        self.observer = observer
        var count = 1
        while count < shards { count *= 2 }
        // 10,000 remembered ids in all, as many per shard.
        self.shards = (0..<count).map { _ in Shard(rememberedIDs: max(10_000 / count, 100)) }
    }

    public var position: String? {
        lock.withLock {
            history.isEnabled ? Position(epoch: epoch, sequence: history.lastSequence).token(key: positionKey) : nil
        }
    }

    public var statistics: EngineStatistics {
        var total = EngineStatistics()
        total.published = lock.withLock { published }
        var channels = Set<String>()
        for shard in shards {
            shard.lock.withLock {
                let s = shard.stats
                total.clients += shard.sessions.count
                total.subscriptions += s.subscriptions
                total.queued += s.queued
                total.overflowDrops += s.overflowDrops
                total.resent += s.resent
                total.expired += s.expired
                total.queueDepth += shard.sessions.values.reduce(0) { $0 + $1.queue.count }
                channels.formUnion(shard.index.keys)
            }
        }
        total.channels = channels.count
        return total
    }

    /// Always: the memory engine depends on nothing outside the process.
    public var isReady: Bool { true }

    /// Nothing beyond `statistics`.
    public var extraMetrics: [EngineMetric] { [] }

    public func createClient(now: NIODeadline, user: String?, on loop: any EventLoop) -> EventLoopFuture<String> {
        while true {
            let id = ClientID.random()
            let number = shardNumber(for: id)
            let shard = shards[number]
            let created = shard.lock.withLock { () -> Bool in
                guard shard.sessions[id] == nil else { return false }
                let session = Session(id: id, shard: number, expiresAt: now + lifetime)
                session.user = user
                session.since = now
                shard.sessions[id] = session
                record(SessionEvent(kind: .handshake, clientId: id, user: user), in: shard)
                return true
            }
            if created {
                report()
                return loop.makeSucceededFuture(id)
            }
        }
    }

    public func clientExists(_ clientId: String, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        let shard = shard(for: clientId)
        return loop.makeSucceededFuture(shard.lock.withLock { shard.sessions[clientId] != nil })
    }

    /// Runs `body` on the session under its shard's lock (nil when the client is unknown); for `MemoryEngine+User`.
    func withSession<T>(_ clientId: String, _ body: (Session) -> T) -> T? {
        let shard = shard(for: clientId)
        return shard.lock.withLock { shard.sessions[clientId].map(body) }
    }

    public func connect(
        _ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt, on loop: any EventLoop
    ) -> EventLoopFuture<ConnectResult> {
        loop.makeSucceededFuture(connectNow(clientId, now: now, sink: sink, receipt: receipt))
    }

    /// Nothing here waits: the connect is answered when this returns.
    public func connecting(
        _ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt, on loop: any EventLoop
    ) -> Eventual<ConnectResult> {
        .value(connectNow(clientId, now: now, sink: sink, receipt: receipt))
    }

    func connectNow(_ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt)
        -> ConnectResult
    {
        var superseded: (any DeliverySink)?
        var canonical: String?
        var notifications: [(any DeliverySink, DetachReason)] = []
        let shard = shard(for: clientId)
        var result = shard.lock.withLock { () -> ConnectResult in
            guard let session = shard.sessions[clientId] else {
                return ConnectResult(
                    status: shard.overflowedClients.contains(clientId)
                        ? .overflowed : missingStatus(clientId, in: shard))
            }
            canonical = session.id
            session.expiresAt = now + lifetime
            let first = !session.connectedOnce
            session.connectedOnce = true
            let sameConnection = sink.map { $0 === session.sink } ?? (session.sink != nil)
            session.ledger.confirm(
                connectId: receipt.connectId, ack: receipt.ack,
                opensSocket: !sameConnection && sink?.isPersistent == true)
            // What the last connection was handed is in the ledger or confirmed: the queue lets go of it.
            session.queue.release()
            if !sameConnection, !session.ledger.isEmpty || session.ledger.hasGap {
                guard resend(session, in: shard) else {
                    remove(session, from: shard, reason: .overflow, notifications: &notifications)
                    return ConnectResult(status: .overflowed)
                }
            }
            guard let sink else {
                if session.sink != nil { return ConnectResult(status: .ok) }
                return ConnectResult(status: .ok, events: take(session))
            }
            if sink.isPersistent {
                if let old = session.sink, old !== sink { superseded = old }
                session.sink = sink
                session.streaming = false
                session.wakeScheduled = false
                return ConnectResult(status: .ok, events: take(session), attached: true, answerNow: first)
            }
            if first || !session.queue.isEmpty {
                if let old = session.sink, !old.isPersistent {
                    superseded = old
                    session.sink = nil
                    session.wakeScheduled = false
                }
                return ConnectResult(status: .ok, events: take(session))
            }
            if let old = session.sink { superseded = old }
            session.sink = sink
            session.streaming = false
            session.wakeScheduled = false
            return ConnectResult(status: .ok, attached: true, answerNow: false)
        }
        result.clientId = canonical
        if let superseded { notify([(superseded, .superseded)]) }
        if !notifications.isEmpty {
            notify(notifications)
            report()
        }
        return result
    }

    /// Puts what the session's last connection was handed and its client has not confirmed back before its queue,
    /// to go out again on this one; false when that cannot be whole (the ledger lost events to its bound, or they
    /// do not fit the queue): the session is then dropped, and its client told to handshake again. The shard's
    /// lock is held.
    private func resend(_ session: Session, in shard: Shard) -> Bool {
        guard !session.ledger.hasGap else { return false }
        let unconfirmed = session.ledger.takeUnconfirmed()
        guard session.queue.count + unconfirmed.count <= configuration.maxQueue else { return false }
        var queue = unconfirmed
        queue.append(contentsOf: session.queue.events)
        session.queue.replace(with: queue)
        shard.stats.resent += UInt64(unconfirmed.count)
        return true
    }

    public func closeBatch(_ clientId: String, connectId: JSONValue?) -> UInt64? {
        withSession(clientId) { session in
            let onSocket = session.sink?.isPersistent == true && !session.streaming
            return UInt64(session.ledger.closeBatch(connectId: connectId, onSocket: onSocket))
        }
    }

    public func attach(_ clientId: String, sink: any DeliverySink, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        var superseded: (any DeliverySink)?
        var wake: [(Session, any DeliverySink)] = []
        let ok =
            withSession(clientId) { session in
                if let old = session.sink, old !== sink { superseded = old }
                session.sink = sink
                session.streaming = true
                session.wakeScheduled = false
                if !session.queue.isEmpty {
                    session.wakeScheduled = true
                    wake.append((session, sink))
                }
                return true
            } ?? false
        if let superseded { notify([(superseded, .superseded)]) }
        if !wake.isEmpty { wakeUp(wake) }
        return loop.makeSucceededFuture(ok)
    }

    public func detach(_ clientId: String, sink: any DeliverySink, takeEvents: Bool) -> CircularBuffer<WireEvent> {
        withSession(clientId) { session in
            guard session.sink === sink else { return .noEvents }
            session.sink = nil
            session.wakeScheduled = false
            return takeEvents ? take(session) : []
        } ?? .noEvents
    }

    /// Takes the session's queue to hand it to a connection, keeping it in the ledger until the client confirms
    /// it (not for a stream); the shard's lock is held.
    func take(_ session: Session) -> CircularBuffer<WireEvent> {
        guard !session.queue.isEmpty else { return .noEvents }
        let events = session.queue.take()
        if !session.streaming { session.ledger.handedOut(events, capacity: configuration.maxQueue) }
        return events
    }

    public func subscribe(
        _ clientId: String, to channels: [String], resume: String?, now: NIODeadline, on loop: any EventLoop
    ) -> EventLoopFuture<(SubscriptionResult, ResumeResult?)> {
        var after = Aftermath()
        let shard = shard(for: clientId)
        let result = shard.lock.withLock { () -> (SubscriptionResult, ResumeResult?) in
            guard let session = shard.sessions[clientId] else {
                return (shard.overflowedClients.contains(clientId) ? .overflowed : .unknownClient, nil)
            }
            // A resume's range is read from the history: what the history holds is queued here first, before the
            // subscription is added, so that nothing comes both from the range and live.
            if resume != nil {
                catchUp(shard, &after)
                // What was queued may have filled the session's own queue, and dropped it.
                guard shard.sessions[clientId] === session else { return (.overflowed, nil) }
            }
            var subscribed: [String] = []
            var result = SubscriptionResult.ok
            for channel in channels {
                if session.subscriptions.contains(channel) {
                    subscribed.append(channel)
                    continue
                }
                if session.subscriptions.count >= configuration.maxSubscriptionsPerClient {
                    result = .limitReached(channel)
                    break
                }
                // The index's own key when the channel has subscribers: one string per channel, not one per
                // subscriber (each client's message brought its own copy).
                let channel = shard.index.index(forKey: channel).map { shard.index.keys[$0] } ?? channel
                session.subscriptions.insert(channel)
                shard.index[channel, default: [:]][session.id] = session
                shard.stats.subscriptions += 1
                subscribed.append(channel)
                record(
                    SessionEvent(kind: .subscribe, clientId: clientId, channel: channel, user: session.user), in: shard)
            }
            guard let resume else { return (result, nil) }
            let outcome = replay(after: resume, matching: subscribed, into: session, in: shard, now: now)
            if outcome.recovered, outcome.missed > 0, let sink = session.sink, !session.wakeScheduled {
                session.wakeScheduled = true
                after.wakes.append((session, sink))
            }
            return (result, outcome)
        }
        finish(after)
        report()
        return loop.makeSucceededFuture(result)
    }

    /// Queues the held events after `token` that match `patterns`; the shard's lock is held, the engine's is taken
    /// to read the history. Only events the shard has queued already are replayed (`catchUp` has queued what the
    /// history held): those after them reach the session live, now that it is subscribed.
    private func replay(
        after token: String, matching patterns: [String], into session: Session, in shard: Shard, now: NIODeadline
    ) -> ResumeResult {
        func matches(_ channel: String) -> Bool {
            patterns.contains { Channel.matches(pattern: $0, name: channel) }
        }
        let queued = shard.nextTicket
        let found = lock.withLock { () -> (CircularBuffer<WireEvent>?, missed: Int) in
            history.prune(now: now)
            guard history.isEnabled, let position = Position(token: token, key: positionKey), position.epoch == epoch
            else {
                return (nil, 0)
            }
            guard let entries = history.entries(after: position.sequence) else {
                return (nil, history.countHeld(after: position.sequence, matching: matches))
            }
            var missed = CircularBuffer<WireEvent>(initialCapacity: entries.count)
            for entry in entries where entry.ticket < queued && matches(entry.channel) { missed.append(entry.event) }
            return (missed, missed.count)
        }
        guard let missed = found.0 else { return ResumeResult(recovered: false, missed: found.missed) }
        guard placeRange(missed, resuming: patterns, in: session, of: shard) else {
            return ResumeResult(recovered: false, missed: missed.count)
        }
        return ResumeResult(recovered: true, missed: missed.count)
    }

    /// Queues a resume's range before anything newer, exactly once. What the session's queue and ledger hold of
    /// it is removed first (the same event is the same bytes, its position in them), and so is every other event
    /// with a position on a channel the resume names: the client resumed from its last position there, so it had
    /// those up to it, and the range holds the rest. An event without a position (one published while Redis was
    /// away) stays. False when it does not fit the queue (nothing changed then). The shard's lock is held.
    func placeRange(
        _ range: CircularBuffer<WireEvent>, resuming patterns: [String], in session: Session, of shard: Shard
    ) -> Bool {
        guard !range.isEmpty || !patterns.isEmpty else { return true }
        let covered = Set(range)
        var resumed: [String: Bool] = [:]
        func superseded(_ event: WireEvent) -> Bool {
            if covered.contains(event) { return true }
            guard !patterns.isEmpty, let channel = event.positionedChannel else { return false }
            if let known = resumed[channel] { return known }
            let matches = patterns.contains { Channel.matches(pattern: $0, name: channel) }
            resumed[channel] = matches
            return matches
        }
        var rest = session.queue.events
        rest.removeAll(where: superseded)
        guard rest.count + range.count <= configuration.maxQueue else { return false }
        session.ledger.remove(where: superseded)
        var queue = range
        queue.append(contentsOf: rest)
        session.queue.replace(with: queue)
        shard.stats.queued += UInt64(range.count)
        return true
    }

    public func unsubscribe(_ clientId: String, from channels: [String], on loop: any EventLoop)
        -> EventLoopFuture<SubscriptionResult>
    {
        let shard = shard(for: clientId)
        let result = shard.lock.withLock { () -> SubscriptionResult in
            guard let session = shard.sessions[clientId] else {
                return shard.overflowedClients.contains(clientId) ? .overflowed : .unknownClient
            }
            for channel in channels where session.subscriptions.remove(channel) != nil {
                removeFromIndex(channel, clientId, in: shard)
                record(
                    SessionEvent(kind: .unsubscribe, clientId: clientId, channel: channel, user: session.user),
                    in: shard)
            }
            return .ok
        }
        report()
        return loop.makeSucceededFuture(result)
    }

    func removeFromIndex(_ channel: String, _ clientId: String, in shard: Shard) {
        shard.stats.subscriptions -= 1
        shard.index[channel]?[clientId] = nil
        if shard.index[channel]?.isEmpty == true { shard.index[channel] = nil }
    }

    public func destroyClient(_ clientId: String, reason: DetachReason, on loop: any EventLoop)
        -> EventLoopFuture<Bool>
    {
        var notifications: [(any DeliverySink, DetachReason)] = []
        let shard = shard(for: clientId)
        let existed = shard.lock.withLock { () -> Bool in
            guard let session = shard.sessions[clientId] else { return false }
            remove(session, from: shard, reason: reason, notifications: &notifications)
            return true
        }
        notify(notifications)
        report()
        return loop.makeSucceededFuture(existed)
    }

    /// Removes a session; the shard's lock is held.
    func remove(
        _ session: Session,
        from shard: Shard,
        reason: DetachReason,
        notifications: inout [(any DeliverySink, DetachReason)]
    ) {
        shard.sessions[session.id] = nil
        for channel in session.subscriptions { removeFromIndex(channel, session.id, in: shard) }
        session.subscriptions = []
        session.queue.clear()
        session.ledger.reset()
        if let sink = session.sink {
            notifications.append((sink, reason))
            session.sink = nil
        } else if reason == .overflow, logger != nil {
            shard.unattachedDrops.append((session.id, session.transport))
        }
        if let ended = SessionEvent.EndReason(reason) {
            record(
                SessionEvent(kind: .disconnect, clientId: session.id, user: session.user, reason: ended), in: shard)
        }
        if reason == .kicked { shard.kickedClients.insert(session.id) }
        if reason == .overflow {
            shard.stats.overflowDrops += 1
            shard.overflowedClients.insert(session.id)
        }
    }

    public func publish(_ message: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<String?>
    {
        loop.makeSucceededFuture(publishNow(message, to: channel, now: now))
    }

    /// Nothing here waits: the publish is done, and its position known, when this returns.
    public func publishing(_ message: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> Eventual<String?>
    {
        .value(publishNow(message, to: channel, now: now))
    }

    /// The publish: queued for every subscriber of `channel`; returns the event's position (nil without history).
    func publishNow(_ message: Message, to channel: String, now: NIODeadline) -> String? {
        let keys = Channel.expand(channel)
        let compression = configuration.eventCompression
        // Encoding and compressing happen out of any lock. Without history an event has no position: it is made
        // first, then takes a ticket. With history the engine lock is taken twice: once for the sequence, once to
        // append the event to the history with its ticket; an event encoded before the one ahead of it waits in
        // `encoded` and is appended right after it (by whichever publish appends that one), so tickets follow
        // positions and every subscriber sees events in position order.
        guard configuration.historySize > 0 else {
            let event = WireEvent(encoding: message, compression: compression)
            let ticket = lock.withLock { () -> UInt64 in
                published += 1
                tickets += 1
                return tickets
            }
            distribute([Fan(event: event, keys: keys)], first: ticket)
            return nil
        }
        let sequence = lock.withLock { history.nextSequence() }
        var positioned = message
        let position = Position(epoch: epoch, sequence: sequence).token(key: positionKey)
        positioned.setPosition(position)
        let event = WireEvent(encoding: positioned, compression: compression)
        var fans: [Fan] = []
        let first = lock.withLock { () -> UInt64 in
            encoded[sequence] = (event, channel, keys, now)
            let first = tickets + 1
            while let next = encoded.removeValue(forKey: history.lastSequence + 1) {
                tickets += 1
                history.prune(now: next.now)
                history.append(
                    History.Entry(
                        sequence: history.lastSequence + 1, channel: next.channel, event: next.event,
                        publishedAt: next.now, ticket: tickets))
                published += 1
                fans.append(Fan(event: next.event, keys: next.keys))
            }
            return first
        }
        if !fans.isEmpty { distribute(fans, first: first) }
        return position
    }

    /// Queues an event that has no place in this engine's history (`enqueue`): a ticket, then every shard.
    func distribute(_ event: WireEvent, keys: [String]) -> [String] {
        let ticket = lock.withLock { () -> UInt64 in
            tickets += 1
            return tickets
        }
        return distribute([Fan(event: event, keys: keys)], first: ticket)
    }

    /// Records a session event for the observer; the shard's lock is held.
    @inline(__always)
    private func record(_ event: SessionEvent, in shard: Shard) {
        if observer != nil { shard.recorded.append(event) }
    }

    /// Hands the recorded session events to the observer, and logs drops no connection saw; called with no lock
    /// held.
    func report() {
        guard observer != nil || logger != nil else { return }
        var events: [SessionEvent] = []
        var drops: [(String, ConnectionType?)] = []
        for shard in shards {
            shard.lock.withLock {
                if !shard.recorded.isEmpty {
                    events.append(contentsOf: shard.recorded)
                    shard.recorded.removeAll()
                }
                if !shard.unattachedDrops.isEmpty {
                    drops.append(contentsOf: shard.unattachedDrops)
                    shard.unattachedDrops.removeAll()
                }
            }
        }
        if let observer, !events.isEmpty { observer.sessionEvents(events) }
        for (clientId, transport) in drops {
            logger?.info(
                "slow consumer dropped: queue overflow",
                metadata: [
                    "pubsub.client.id": "\(clientId)", "pubsub.transport": "\(transport?.rawValue ?? "none attached")",
                ])
        }
    }

    func notify(_ notifications: [(any DeliverySink, DetachReason)]) {
        for (sink, reason) in notifications {
            sink.eventLoop.execute { sink.detached(reason) }
        }
    }

    public func sweep(now: NIODeadline) {
        var notifications: [(any DeliverySink, DetachReason)] = []
        for shard in shards {
            shard.lock.withLock {
                let expired = shard.sessions.values.filter { $0.expiresAt <= now }
                for session in expired {
                    remove(session, from: shard, reason: .expired, notifications: &notifications)
                }
                shard.stats.expired += UInt64(expired.count)
            }
        }
        notify(notifications)
        report()
    }

    public func shutdown() {
        var notifications: [(any DeliverySink, DetachReason)] = []
        for shard in shards {
            shard.lock.withLock {
                for session in shard.sessions.values {
                    if let sink = session.sink {
                        notifications.append((sink, .shutdown))
                        session.sink = nil
                        session.wakeScheduled = false
                    }
                }
            }
        }
        notify(notifications)
    }
}
