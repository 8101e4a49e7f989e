import Bayeux
import NIOConcurrencyHelpers
import NIOCore

extension MemoryEngine {
    /// A part of the sessions, chosen by client id (`shard(for:)`), with its own lock, subscription index, queues
    /// and counts. What a publish does for each subscriber happens under the lock of the subscriber's shard, one
    /// shard at a time, so a broadcast holds up a handshake, subscribe or drain elsewhere for one shard's part of
    /// it at most, never for the whole fan-out.
    ///
    /// Events reach a shard in ticket order: the engine hands out tickets in the order events are published (with
    /// history: in position order), and an event that arrives before the one ahead of it waits in `early` until
    /// that one is queued, by whichever call queues it. So every subscriber sees events in one order, whichever
    /// shard it is in and whichever thread published them.
    // @unchecked: every `var` is guarded by `lock`.
    final class Shard: @unchecked Sendable {
        let lock = NIOLock()
        var sessions: [String: Session] = [:]
        /// Channel (or pattern) to its subscribers in this shard.
        var index: [String: [String: Session]] = [:]
        /// Marks the sessions one fan-out has queued for (a session matching two patterns gets the event once).
        var stamp: UInt64 = 0
        /// Everything but `published`, which the engine counts; summed over shards by `statistics`.
        var stats = EngineStatistics()
        /// Clients dropped for overflow, remembered so their next request is told why (bounded, oldest forgotten).
        var overflowedClients: RecentIDs
        /// Clients removed by the server API, so a later connect is told not to reconnect (bounded).
        var kickedClients: RecentIDs
        /// Session events recorded under the lock, reported after it (see `SessionEvents.swift`).
        var recorded: [SessionEvent] = []
        /// Overflow drops of clients with no connection attached, noted under the lock and logged after it.
        var unattachedDrops: [(String, ConnectionType?)] = []
        /// The ticket of the next event this shard queues.
        var nextTicket: UInt64 = 1
        /// Events whose ticket came before an earlier one reached this shard.
        var early: [UInt64: Fan] = [:]

        init(rememberedIDs: Int) {
            overflowedClients = RecentIDs(limit: rememberedIDs)
            kickedClients = RecentIDs(limit: rememberedIDs)
        }
    }

    /// An event on its way to the shards: what is queued, and the index keys its channel matches.
    struct Fan {
        let event: WireEvent
        let keys: [String]
    }

    /// The shard that holds (or will hold) the session `clientId`.
    @inline(__always)
    func shard(for clientId: String) -> Shard {
        shards[shardNumber(for: clientId)]
    }

    /// Its place in `shards`: from the id's hash, which is the same for the same id throughout the process.
    @inline(__always)
    func shardNumber(for clientId: String) -> Int {
        clientId.hashValue & (shards.count - 1)
    }

    /// What queueing events in a shard leaves to do once its lock is released.
    struct Aftermath {
        var wakes: [(Session, any DeliverySink)] = []
        var notifications: [(any DeliverySink, DetachReason)] = []
        /// Sessions dropped because their queue was full.
        var overflowed: [String] = []
    }

    /// Hands events to every shard; `fans[i]` has ticket `first + i`. Returns the ids of the sessions dropped
    /// because their queue was full, by this call: an event that had to wait in a shard is queued there (and its
    /// drops counted) by the call that queues the one ahead of it.
    @discardableResult
    func distribute(_ fans: [Fan], first: UInt64) -> [String] {
        var after = Aftermath()
        for shard in shards {
            shard.lock.withLock {
                for (offset, fan) in fans.enumerated() { queue(fan, ticket: first + UInt64(offset), in: shard, &after) }
            }
        }
        finish(after)
        return after.overflowed
    }

    /// Wakes, notifies and reports what `after` holds; no lock is held.
    func finish(_ after: Aftermath) {
        if !after.wakes.isEmpty { wakeUp(after.wakes) }
        if !after.notifications.isEmpty { notify(after.notifications) }
        if !after.overflowed.isEmpty { report() }
    }

    /// Queues the event with `ticket` in `shard` if it is the shard's next one (then any that waited for it),
    /// keeps it for later if one before it has not arrived, and ignores it if the shard has queued it already (a
    /// resuming subscribe caught the shard up, `catchUp`). The shard's lock is held.
    func queue(_ fan: Fan, ticket: UInt64, in shard: Shard, _ after: inout Aftermath) {
        guard ticket >= shard.nextTicket else { return }
        guard ticket == shard.nextTicket else {
            shard.early[ticket] = fan
            return
        }
        fanOut(fan, in: shard, &after)
        shard.nextTicket += 1
        while let waiting = shard.early.removeValue(forKey: shard.nextTicket) {
            fanOut(waiting, in: shard, &after)
            shard.nextTicket += 1
        }
    }

    /// Queues, in `shard`, what the history holds that has not reached the shard yet (events whose publishers are
    /// still on their way through the shards), so that a subscription added next neither gets them live nor
    /// misses them: it gets them from the history if its position is before them, and not at all if not. The
    /// shard's lock is held; the engine's is taken.
    func catchUp(_ shard: Shard, _ after: inout Aftermath) {
        let behind = lock.withLock { () -> [(ticket: UInt64, fan: Fan)] in
            guard tickets >= shard.nextTicket else { return [] }
            var found: [(ticket: UInt64, fan: Fan)] = []
            var index = history.entries.endIndex
            while index > history.entries.startIndex {
                index = history.entries.index(before: index)
                let entry = history.entries[index]
                guard entry.ticket >= shard.nextTicket else { break }
                found.append((entry.ticket, Fan(event: entry.event, keys: Channel.expand(entry.channel))))
            }
            return found.reversed()
        }
        for (ticket, fan) in behind { queue(fan, ticket: ticket, in: shard, &after) }
    }

    /// Queues the event once for every subscriber in `shard` of its keys, dropping those whose queue is full;
    /// the shard's lock is held.
    @inline(__always)
    private func fanOut(_ fan: Fan, in shard: Shard, _ after: inout Aftermath) {
        shard.stamp &+= 1
        let stamp = shard.stamp
        let maxQueue = configuration.maxQueue
        var overflowed: [Session] = []
        for key in fan.keys {
            guard let subscribers = shard.index[key] else { continue }
            for session in subscribers.values where session.stamp != stamp {
                session.stamp = stamp
                if session.queue.count >= maxQueue {
                    overflowed.append(session)
                    continue
                }
                // Into the storage the queue kept: no allocation once the session has had an event.
                session.queue.append(fan.event)
                shard.stats.queued += 1
                if let sink = session.sink, !session.wakeScheduled {
                    session.wakeScheduled = true
                    after.wakes.append((session, sink))
                }
            }
        }
        for session in overflowed {
            remove(session, from: shard, reason: .overflow, notifications: &after.notifications)
            after.overflowed.append(session.id)
        }
    }

    /// One task per event loop: it drains every woken session of that loop, under each shard's lock once, then
    /// delivers. Wakes of one shard are next to each other (`distribute` goes shard by shard).
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
        var start = 0
        while start < wakes.count {
            let number = wakes[start].0.shard
            var end = start
            shards[number].lock.withLock {
                while end < wakes.count, wakes[end].0.shard == number {
                    let (session, sink) = wakes[end]
                    end += 1
                    guard session.sink === sink, session.wakeScheduled else { continue }
                    session.wakeScheduled = false
                    if !sink.isPersistent { session.sink = nil }
                    let events = take(session)
                    if !events.isEmpty { deliveries.append((sink, events)) }
                }
            }
            start = end
        }
        for (sink, events) in deliveries { sink.deliver(events) }
    }
}
