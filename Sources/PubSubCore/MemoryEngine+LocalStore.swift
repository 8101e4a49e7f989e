import Bayeux
import NIOConcurrencyHelpers
import NIOCore

/// A clustered engine keeps the sessions whose connections are on its node in a memory engine: the same sinks,
/// bounded queues and wakeups. These calls move sessions in and out and queue events routed from other nodes.
/// `package`: the Redis engine's target uses them; they are no part of the library's API.
extension MemoryEngine {
    package func hasSession(_ clientId: String) -> Bool {
        withSession(clientId) { _ in true } ?? false
    }

    /// Creates the session `clientId`, or sets the subscriptions of the existing one; false when it existed.
    @discardableResult
    package func adopt(_ clientId: String, subscriptions: [String], connectedOnce: Bool, now: NIODeadline) -> Bool {
        let number = shardNumber(for: clientId)
        let shard = shards[number]
        return shard.lock.withLock {
            let session: Session
            let created: Bool
            if let existing = shard.sessions[clientId] {
                session = existing
                created = false
            } else {
                session = Session(id: clientId, shard: number, expiresAt: now + lifetime)
                shard.sessions[clientId] = session
                created = true
            }
            session.connectedOnce = session.connectedOnce || connectedOnce
            let wanted = Set(subscriptions)
            for channel in session.subscriptions.filter({ !wanted.contains($0) }) {
                session.subscriptions.remove(channel)
                removeFromIndex(channel, clientId, in: shard)
            }
            for channel in wanted where !session.subscriptions.contains(channel) {
                session.subscriptions.insert(channel)
                shard.index[channel, default: [:]][clientId] = session
                shard.stats.subscriptions += 1
            }
            return created
        }
    }

    /// Removes the session, detaching its sink with `reason`, and returns what was queued for it, after what was
    /// handed out since its last connect reply (`DeliveryLedger.takeOpenBatch`: a session handed over to another
    /// node sends that again there); nil when absent. `.expired` and `.overflow` are counted as for a session of
    /// this engine.
    @discardableResult
    package func evict(_ clientId: String, reason: DetachReason) -> CircularBuffer<WireEvent>? {
        var notifications: [(any DeliverySink, DetachReason)] = []
        let shard = shard(for: clientId)
        let queue = shard.lock.withLock { () -> CircularBuffer<WireEvent>? in
            guard let session = shard.sessions[clientId] else { return nil }
            var queue = session.ledger.takeOpenBatch()
            queue.append(contentsOf: session.queue.events)
            if reason == .expired { shard.stats.expired += 1 }
            remove(session, from: shard, reason: reason, notifications: &notifications)
            return queue
        }
        notify(notifications)
        report()
        return queue
    }

    /// Queues an event encoded elsewhere for every local subscriber of `channel` (no history, no statistics of
    /// publishing); returns the ids of the clients dropped because their queue was full. An event read from
    /// another node becomes a `WireEvent` (framed, and compressed) once here, not once per WebSocket recipient.
    package func enqueue(_ event: ByteBuffer, on channel: String) -> [String] {
        enqueue(WireEvent(json: event, compression: configuration.eventCompression), on: channel)
    }

    /// Events encoded elsewhere (handed over by another node, a range read from Redis) as this node's transports
    /// write them.
    package func wireEvents(_ events: [ByteBuffer]) -> CircularBuffer<WireEvent> {
        var out = CircularBuffer<WireEvent>(initialCapacity: events.count)
        for event in events { out.append(WireEvent(json: event, compression: configuration.eventCompression)) }
        return out
    }

    /// `enqueue` for an event this node made (a publish while Redis is away). Queued in every shard before this
    /// returns, unless a call on another thread with an earlier event is still on its way through the shards:
    /// that call then queues this event after its own (and returns its drops).
    package func enqueue(_ event: WireEvent, on channel: String) -> [String] {
        distribute(event, keys: Channel.expand(channel))
    }

    /// Puts events before the session's queue: handed over by another node (`resuming` nil), or the range of a
    /// resume of the channels `resuming` (`placeRange`: what the queue and the ledger hold of them is removed, so
    /// each goes out once, before anything newer). Nil when there is no such session; false when they did not fit
    /// and the client was dropped for overflow.
    package func insert(_ events: CircularBuffer<WireEvent>, into clientId: String, resuming: [String]?) -> Bool? {
        var wake: [(Session, any DeliverySink)] = []
        var notifications: [(any DeliverySink, DetachReason)] = []
        let shard = shard(for: clientId)
        let result = shard.lock.withLock { () -> Bool? in
            guard let session = shard.sessions[clientId] else { return nil }
            if let resuming {
                guard placeRange(events, resuming: resuming, in: session, of: shard) else {
                    remove(session, from: shard, reason: .overflow, notifications: &notifications)
                    return false
                }
                guard !events.isEmpty else { return true }
            } else {
                guard !events.isEmpty else { return true }
                guard session.queue.count + events.count <= configuration.maxQueue else {
                    remove(session, from: shard, reason: .overflow, notifications: &notifications)
                    return false
                }
                var merged = events
                merged.append(contentsOf: session.queue.events)
                session.queue.replace(with: merged)
                shard.stats.queued += UInt64(events.count)
            }
            if let sink = session.sink, !session.wakeScheduled {
                session.wakeScheduled = true
                wake.append((session, sink))
            }
            return true
        }
        if !wake.isEmpty { wakeUp(wake) }
        if !notifications.isEmpty { notify(notifications) }
        if result == false { report() }
        return result
    }

    /// The subscriptions of `clientId` (nil when it is not here).
    package func subscriptions(of clientId: String) -> Set<String>? {
        withSession(clientId) { Set($0.subscriptions) }
    }

    /// Every session and its subscriptions.
    package func snapshot() -> [(id: String, subscriptions: [String])] {
        shards.flatMap { shard in
            shard.lock.withLock { shard.sessions.values.map { ($0.id, Array($0.subscriptions)) } }
        }
    }
}
