import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore

/// The in-process engine: every session, subscription and queue lives in this process.
///
/// One lock guards the state; a publish takes it once, appends the same encoded buffer to each recipient's
/// queue and collects the sinks to wake, grouped by event loop, so each loop gets one task per publish burst
/// (not one per recipient) and drains all its sessions under a single lock acquisition.
// @unchecked: every `var` is guarded by `lock`.
public final class MemoryEngine: Engine, EngineObservability, @unchecked Sendable {
    /// Guarded by the engine lock; handed between event loops only inside wake-up tasks.
    // @unchecked: guarded by the engine's `lock`; handed between event loops only inside wake-up tasks.
    final class Session: @unchecked Sendable {
        let id: String
        var subscriptions = SubscriptionSet()
        var queue = CircularBuffer<WireEvent>.noEvents
        var expiresAt: NIODeadline
        var sink: (any DeliverySink)?
        var wakeScheduled = false
        var connectedOnce = false
        /// The attached sink is an EventSource stream (`attach`): what it is handed is not kept in the ledger.
        var streaming = false
        /// What connections were handed and the client has not confirmed (`DeliveryLedger`).
        var ledger = DeliveryLedger()
        var stamp: UInt64 = 0
        /// The user an authorization mode established (JWT `sub`, the hook's handshake answer); see `setUser`.
        var user: String?
        /// What an authorization mode granted at the handshake (`SessionGrant.encoded`); see `setGrant`.
        var grant: String?
        /// For presence (`MemoryEngine+Presence.swift`): the latest connect's type, the handshake's time.
        var transport: ConnectionType?
        var since: NIODeadline?

        init(id: String, expiresAt: NIODeadline) {
            self.id = id
            self.expiresAt = expiresAt
        }
    }

    let lock = NIOLock()
    var sessions: [String: Session] = [:]
    var index: [String: [String: Session]] = [:]
    private var stamp: UInt64 = 0
    var stats = EngineStatistics()
    /// Clients dropped for overflow, remembered so their next request is told why (bounded, oldest forgotten).
    private var overflowedClients = RecentIDs(limit: 10_000)
    /// Clients removed by the server API, so a later connect is told not to reconnect (bounded).
    var kickedClients = RecentIDs(limit: 10_000)

    var history: History
    /// Publishes encoded out of the lock, waiting for an earlier sequence to be queued first (`publish`).
    private var encoded: [UInt64: (event: WireEvent, channel: String, keys: [String], now: NIODeadline)] = [:]
    /// Changes at every start: positions of an earlier run are never taken for positions in this one.
    package let epoch: UInt64
    /// The secret that makes positions opaque (`PositionCipher`); new at every start, like the epoch.
    package let positionKey: PositionKey

    public let configuration: BrokerConfiguration
    var lifetime: TimeAmount { configuration.timeout * 2 }

    /// Told about handshakes, subscriptions and ended sessions (webhooks); nil records nothing.
    private let observer: (any SessionEventObserver)?
    /// Session events recorded under the lock, reported after it (see `SessionEvents.swift`).
    private var recorded: [SessionEvent] = []

    /// Says when a client with no connection attached is dropped for overflow (a polling client between two
    /// polls): no transport sees that drop, so the engine logs it. Drops of attached clients are logged by their
    /// connection.
    private let logger: Logger?
    /// Such drops, noted under the lock and logged after it: client id and the transport of its latest connect.
    private var unattachedDrops: [(String, ConnectionType?)] = []

    public convenience init(
        configuration: BrokerConfiguration, events observer: (any SessionEventObserver)? = nil, logger: Logger? = nil
    ) {
        self.init(
            configuration: configuration, epoch: .random(in: 1...(1 << 52)), positionKey: .random(), events: observer,
            logger: logger)
    }

    /// With a given epoch and position key: tests that compare positions across engines or runs.
    package init(
        configuration: BrokerConfiguration, epoch: UInt64, positionKey: PositionKey = .random(),
        events observer: (any SessionEventObserver)? = nil,
        logger: Logger? = nil
    ) {
        self.logger = logger
        self.configuration = configuration
        self.history = History(
            capacity: configuration.historySize, maxBytes: configuration.historyBytes, maxAge: configuration.historyTTL)
        self.epoch = epoch
        self.positionKey = positionKey
        self.observer = observer
    }

    public var position: String? {
        lock.withLock {
            history.isEnabled ? Position(epoch: epoch, sequence: history.lastSequence).token(key: positionKey) : nil
        }
    }

    public var statistics: EngineStatistics {
        lock.withLock {
            var s = stats
            s.clients = sessions.count
            s.channels = index.count
            s.queueDepth = sessions.values.reduce(0) { $0 + $1.queue.count }
            return s
        }
    }

    /// Always: the memory engine depends on nothing outside the process.
    public var isReady: Bool { true }

    /// Nothing beyond `statistics`.
    public var extraMetrics: [EngineMetric] { [] }

    public func createClient(now: NIODeadline, user: String?, on loop: any EventLoop) -> EventLoopFuture<String> {
        let id = lock.withLock { () -> String in
            var id = ClientID.random()
            while sessions[id] != nil { id = ClientID.random() }
            let session = Session(id: id, expiresAt: now + lifetime)
            session.user = user
            session.since = now
            sessions[id] = session
            record(SessionEvent(kind: .handshake, clientId: id, user: user))
            return id
        }
        report()
        return loop.makeSucceededFuture(id)
    }

    public func clientExists(_ clientId: String, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        loop.makeSucceededFuture(lock.withLock { sessions[clientId] != nil })
    }

    /// Runs `body` on the session under the lock (nil when the client is unknown); for `MemoryEngine+User`.
    func withSession<T>(_ clientId: String, _ body: (Session) -> T) -> T? {
        lock.withLock { sessions[clientId].map(body) }
    }

    public func connect(
        _ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt, on loop: any EventLoop
    ) -> EventLoopFuture<ConnectResult> {
        var superseded: (any DeliverySink)?
        var canonical: String?
        var notifications: [(any DeliverySink, DetachReason)] = []
        var result = lock.withLock { () -> ConnectResult in
            guard let session = sessions[clientId] else {
                return ConnectResult(
                    status: overflowedClients.contains(clientId) ? .overflowed : missingStatus(clientId))
            }
            canonical = session.id
            session.expiresAt = now + lifetime
            let first = !session.connectedOnce
            session.connectedOnce = true
            let sameConnection = sink.map { $0 === session.sink } ?? (session.sink != nil)
            session.ledger.confirm(
                connectId: receipt.connectId, ack: receipt.ack,
                opensSocket: !sameConnection && sink?.isPersistent == true)
            if !sameConnection, !session.ledger.isEmpty || session.ledger.hasGap {
                guard resend(session) else {
                    remove(session, reason: .overflow, notifications: &notifications)
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
        return loop.makeSucceededFuture(result)
    }

    /// Puts what the session's last connection was handed and its client has not confirmed back before its queue,
    /// to go out again on this one; false when that cannot be whole (the ledger lost events to its bound, or they
    /// do not fit the queue): the session is then dropped, and its client told to handshake again. The lock is held.
    private func resend(_ session: Session) -> Bool {
        guard !session.ledger.hasGap else { return false }
        let unconfirmed = session.ledger.takeUnconfirmed()
        guard session.queue.count + unconfirmed.count <= configuration.maxQueue else { return false }
        var queue = unconfirmed
        queue.append(contentsOf: session.queue)
        session.queue = queue
        stats.resent += UInt64(unconfirmed.count)
        return true
    }

    public func closeBatch(_ clientId: String, connectId: JSONValue?) -> UInt64? {
        lock.withLock {
            sessions[clientId].map { session in
                let onSocket = session.sink?.isPersistent == true && !session.streaming
                return UInt64(session.ledger.closeBatch(connectId: connectId, onSocket: onSocket))
            }
        }
    }

    public func attach(_ clientId: String, sink: any DeliverySink, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        var superseded: (any DeliverySink)?
        var wake: [(Session, any DeliverySink)] = []
        let ok = lock.withLock { () -> Bool in
            guard let session = sessions[clientId] else { return false }
            if let old = session.sink, old !== sink { superseded = old }
            session.sink = sink
            session.streaming = true
            session.wakeScheduled = false
            if !session.queue.isEmpty {
                session.wakeScheduled = true
                wake.append((session, sink))
            }
            return true
        }
        if let superseded { notify([(superseded, .superseded)]) }
        if !wake.isEmpty { wakeUp(wake) }
        return loop.makeSucceededFuture(ok)
    }

    public func detach(_ clientId: String, sink: any DeliverySink, takeEvents: Bool) -> CircularBuffer<WireEvent> {
        lock.withLock {
            guard let session = sessions[clientId], session.sink === sink else { return .noEvents }
            session.sink = nil
            session.wakeScheduled = false
            return takeEvents ? take(session) : []
        }
    }

    /// Takes the session's queue to hand it to a connection, keeping it in the ledger until the client confirms
    /// it (not for a stream); the lock is held.
    private func take(_ session: Session) -> CircularBuffer<WireEvent> {
        guard !session.queue.isEmpty else { return .noEvents }
        let events = session.queue
        session.queue = .noEvents
        if !session.streaming { session.ledger.handedOut(events, capacity: configuration.maxQueue) }
        return events
    }

    public func subscribe(
        _ clientId: String, to channels: [String], resume: String?, now: NIODeadline, on loop: any EventLoop
    ) -> EventLoopFuture<(SubscriptionResult, ResumeResult?)> {
        var wake: [(Session, any DeliverySink)] = []
        let result = lock.withLock { () -> (SubscriptionResult, ResumeResult?) in
            guard let session = sessions[clientId] else {
                return (overflowedClients.contains(clientId) ? .overflowed : .unknownClient, nil)
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
                let channel = index.index(forKey: channel).map { index.keys[$0] } ?? channel
                session.subscriptions.insert(channel)
                index[channel, default: [:]][session.id] = session
                stats.subscriptions += 1
                subscribed.append(channel)
                record(SessionEvent(kind: .subscribe, clientId: clientId, channel: channel, user: session.user))
            }
            guard let resume else { return (result, nil) }
            let outcome = replay(after: resume, matching: subscribed, into: session, now: now)
            if outcome.recovered, outcome.missed > 0, let sink = session.sink, !session.wakeScheduled {
                session.wakeScheduled = true
                wake.append((session, sink))
            }
            return (result, outcome)
        }
        if !wake.isEmpty { wakeUp(wake) }
        report()
        return loop.makeSucceededFuture(result)
    }

    /// Queues the held events after `token` that match `patterns`; the lock is held.
    private func replay(after token: String, matching patterns: [String], into session: Session, now: NIODeadline)
        -> ResumeResult
    {
        history.prune(now: now)
        func matches(_ channel: String) -> Bool {
            patterns.contains { Channel.matches(pattern: $0, name: channel) }
        }
        guard history.isEnabled, let position = Position(token: token, key: positionKey), position.epoch == epoch else {
            return ResumeResult(recovered: false, missed: 0)
        }
        guard let entries = history.entries(after: position.sequence) else {
            return ResumeResult(
                recovered: false, missed: history.countHeld(after: position.sequence, matching: matches))
        }
        var missed = CircularBuffer<WireEvent>(initialCapacity: entries.count)
        for entry in entries where matches(entry.channel) { missed.append(entry.event) }
        guard placeRange(missed, in: session) else {
            return ResumeResult(recovered: false, missed: missed.count)
        }
        return ResumeResult(recovered: true, missed: missed.count)
    }

    /// Queues a resume's range before anything newer, exactly once: what the session's queue and ledger already
    /// hold of it is removed first (the same event is the same bytes, its position in them). False when it does
    /// not fit the queue (nothing changed then). The lock is held.
    func placeRange(_ range: CircularBuffer<WireEvent>, in session: Session) -> Bool {
        guard !range.isEmpty else { return true }
        let covered = Set(range)
        var rest = session.queue
        rest.removeAll(where: covered.contains)
        guard rest.count + range.count <= configuration.maxQueue else { return false }
        session.ledger.remove(covered)
        var queue = range
        queue.append(contentsOf: rest)
        session.queue = queue
        stats.queued += UInt64(range.count)
        return true
    }

    public func unsubscribe(_ clientId: String, from channels: [String], on loop: any EventLoop)
        -> EventLoopFuture<SubscriptionResult>
    {
        let result = lock.withLock { () -> SubscriptionResult in
            guard let session = sessions[clientId] else {
                return overflowedClients.contains(clientId) ? .overflowed : .unknownClient
            }
            for channel in channels where session.subscriptions.remove(channel) != nil {
                removeFromIndex(channel, clientId)
                record(SessionEvent(kind: .unsubscribe, clientId: clientId, channel: channel, user: session.user))
            }
            return .ok
        }
        report()
        return loop.makeSucceededFuture(result)
    }

    func removeFromIndex(_ channel: String, _ clientId: String) {
        stats.subscriptions -= 1
        index[channel]?[clientId] = nil
        if index[channel]?.isEmpty == true { index[channel] = nil }
    }

    public func destroyClient(_ clientId: String, reason: DetachReason, on loop: any EventLoop)
        -> EventLoopFuture<Bool>
    {
        var notifications: [(any DeliverySink, DetachReason)] = []
        let existed = lock.withLock { () -> Bool in
            guard let session = sessions[clientId] else { return false }
            remove(session, reason: reason, notifications: &notifications)
            return true
        }
        notify(notifications)
        report()
        return loop.makeSucceededFuture(existed)
    }

    /// Removes a session; the lock is held.
    func remove(
        _ session: Session,
        reason: DetachReason,
        notifications: inout [(any DeliverySink, DetachReason)]
    ) {
        sessions[session.id] = nil
        for channel in session.subscriptions { removeFromIndex(channel, session.id) }
        session.subscriptions = []
        session.queue = .noEvents
        session.ledger.reset()
        if let sink = session.sink {
            notifications.append((sink, reason))
            session.sink = nil
        } else if reason == .overflow, logger != nil {
            unattachedDrops.append((session.id, session.transport))
        }
        if let ended = SessionEvent.EndReason(reason) {
            record(SessionEvent(kind: .disconnect, clientId: session.id, user: session.user, reason: ended))
        }
        if reason == .kicked { kickedClients.insert(session.id) }
        if reason == .overflow {
            stats.overflowDrops += 1
            overflowedClients.insert(session.id)
        }
    }

    public func publish(_ message: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<String?>
    {
        let keys = Channel.expand(channel)
        var wakes: [(Session, any DeliverySink)] = []
        var notifications: [(any DeliverySink, DetachReason)] = []
        var dropped = false
        let compression = configuration.eventCompression
        // Encoding and compressing happen out of the lock. Without history an event has no position: it is made
        // first. With history the lock is taken twice: once for the sequence, once to queue the event; an event
        // encoded before the one ahead of it waits in `encoded` and is queued right after it (by whichever
        // publish queues that one), so every subscriber sees events in position order.
        guard configuration.historySize > 0 else {
            let event = WireEvent(encoding: message, compression: compression)
            lock.withLock {
                stats.published += 1
                dropped = !fanOut(event, keys: keys, wakes: &wakes, notifications: &notifications).isEmpty
            }
            if !wakes.isEmpty { wakeUp(wakes) }
            if !notifications.isEmpty { notify(notifications) }
            if dropped { report() }
            return loop.makeSucceededFuture(nil)
        }
        let sequence = lock.withLock { history.nextSequence() }
        var positioned = message
        let position = Position(epoch: epoch, sequence: sequence).token(key: positionKey)
        positioned.setPosition(position)
        let event = WireEvent(encoding: positioned, compression: compression)
        lock.withLock {
            encoded[sequence] = (event, channel, keys, now)
            while let next = encoded.removeValue(forKey: history.lastSequence + 1) {
                history.prune(now: next.now)
                history.append(
                    History.Entry(
                        sequence: history.lastSequence + 1, channel: next.channel, event: next.event,
                        publishedAt: next.now))
                stats.published += 1
                if !fanOut(next.event, keys: next.keys, wakes: &wakes, notifications: &notifications).isEmpty {
                    dropped = true
                }
            }
        }
        if !wakes.isEmpty { wakeUp(wakes) }
        if !notifications.isEmpty { notify(notifications) }
        if dropped { report() }
        return loop.makeSucceededFuture(position)
    }

    /// Queues `event` once for every subscriber of `keys`, dropping those whose queue is full; the lock is held.
    /// Returns the ids of the dropped sessions.
    @inline(__always)
    func fanOut(
        _ event: WireEvent,
        keys: [String],
        wakes: inout [(Session, any DeliverySink)],
        notifications: inout [(any DeliverySink, DetachReason)]
    ) -> [String] {
        stamp &+= 1
        let stamp = self.stamp
        let maxQueue = configuration.maxQueue
        var overflowed: [Session] = []
        for key in keys {
            guard let subscribers = index[key] else { continue }
            for session in subscribers.values where session.stamp != stamp {
                session.stamp = stamp
                if session.queue.count >= maxQueue {
                    overflowed.append(session)
                    continue
                }
                session.queue.append(event)
                stats.queued += 1
                if let sink = session.sink, !session.wakeScheduled {
                    session.wakeScheduled = true
                    wakes.append((session, sink))
                }
            }
        }
        if overflowed.isEmpty { return [] }
        for session in overflowed { remove(session, reason: .overflow, notifications: &notifications) }
        return overflowed.map(\.id)
    }

    /// One task per event loop: it drains every woken session of that loop under one lock, then delivers.
    func wakeUp(_ wakes: [(Session, any DeliverySink)]) {
        if wakes.count == 1 || wakes.allSatisfy({ $0.1.eventLoop === wakes[0].1.eventLoop }) {
            let loop = wakes[0].1.eventLoop
            loop.execute { self.drain(wakes) }
            return
        }
        var byLoop: [ObjectIdentifier: [(Session, any DeliverySink)]] = [:]
        for wake in wakes { byLoop[ObjectIdentifier(wake.1.eventLoop), default: []].append(wake) }
        for group in byLoop.values {
            group[0].1.eventLoop.execute { self.drain(group) }
        }
    }

    private func drain(_ wakes: [(Session, any DeliverySink)]) {
        var deliveries: [(any DeliverySink, CircularBuffer<WireEvent>)] = []
        deliveries.reserveCapacity(wakes.count)
        lock.withLock {
            for (session, sink) in wakes where session.sink === sink && session.wakeScheduled {
                session.wakeScheduled = false
                if !sink.isPersistent { session.sink = nil }
                let events = take(session)
                if !events.isEmpty { deliveries.append((sink, events)) }
            }
        }
        for (sink, events) in deliveries { sink.deliver(events) }
    }

    /// Records a session event for the observer; the lock is held.
    @inline(__always)
    private func record(_ event: SessionEvent) {
        if observer != nil { recorded.append(event) }
    }

    /// Hands the recorded session events to the observer, and logs drops no connection saw; called after the
    /// lock is released.
    func report() {
        guard observer != nil || logger != nil else { return }
        let (events, drops) = lock.withLock { () -> ([SessionEvent], [(String, ConnectionType?)]) in
            var taken: [SessionEvent] = []
            swap(&taken, &recorded)
            var dropped: [(String, ConnectionType?)] = []
            swap(&dropped, &unattachedDrops)
            return (taken, dropped)
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
        lock.withLock {
            let expired = sessions.values.filter { $0.expiresAt <= now }
            for session in expired { remove(session, reason: .expired, notifications: &notifications) }
            stats.expired += UInt64(expired.count)
        }
        notify(notifications)
        report()
    }

    public func shutdown() {
        var notifications: [(any DeliverySink, DetachReason)] = []
        lock.withLock {
            for session in sessions.values {
                if let sink = session.sink {
                    notifications.append((sink, .shutdown))
                    session.sink = nil
                    session.wakeScheduled = false
                }
            }
        }
        notify(notifications)
    }
}
