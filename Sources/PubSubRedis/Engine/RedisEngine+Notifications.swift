import Logging
import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

/// What arrives on this node's notification channel, handled in Redis' order on the engine's event loop.
extension RedisEngine {
    func received(_ push: RESPValue) {
        guard let parts = push.array, let kind = parts.first?.string else { return }
        switch kind {
        case "message", "smessage":
            guard parts.count == 3, let payload = parts[2].buffer else { return }
            guard let message = NodeMessage.parse(payload) else {
                logger.warning("unreadable notification", metadata: ["pubsub.redis.bytes": "\(payload.readableBytes)"])
                return
            }
            perform(state.withLockedValue { $0.machine.received(message) })
        case "sunsubscribe":
            // The server moved the slot of the notification channel elsewhere.
            cluster?.unsubscribed()
        case "subscribe", "ssubscribe":
            perform(state.withLockedValue { $0.machine.notificationsSubscribed() })
        default:
            break
        }
    }

    func handle(_ message: NodeMessage) {
        switch message {
        case .event(let sequence, let channel, let event):
            let fresh = state.withLockedValue { s -> Bool in
                guard sequence > s.delivered else { return false }
                s.delivered = sequence
                s.lastSequence = max(s.lastSequence, sequence)
                s.redis.eventsReceived += 1
                return true
            }
            if fresh { dropOverflowed(local.enqueue(event, on: channel)) }
        case .adopt(let clientId, let connectedBefore, let subscriptions):
            local.adopt(clientId, subscriptions: subscriptions, connectedOnce: connectedBefore, now: .now())
            let waiters = state.withLockedValue { $0.adoptWaiters.removeValue(forKey: clientId) } ?? []
            for waiter in waiters { waiter.succeed(()) }
        case .move(let clientId, let node):
            handOver(clientId, to: node)
        case .handoff(let clientId, let events):
            let (waiter, abandoned) = state.withLockedValue { s in
                (s.handoffWaiters.removeValue(forKey: clientId), s.abandoned.remove(clientId) != nil)
            }
            if !abandoned, !events.isEmpty,
                local.insert(local.wireEvents(events), into: clientId, resuming: nil) == false
            {
                dropOverflowed([clientId])
            }
            waiter?.succeed(())
        case .subscribed(let clientId, let channels, let events, let resumed):
            guard local.hasSession(clientId) else { return }
            if !channels.isEmpty {
                _ = local.subscribe(clientId, to: channels, resume: nil, now: .now(), on: commands.eventLoop)
            }
            if !events.isEmpty || !resumed.isEmpty,
                local.insert(local.wireEvents(events), into: clientId, resuming: resumed) == false
            {
                dropOverflowed([clientId])
            }
        case .unsubscribed(let clientId, let channels):
            _ = local.unsubscribe(clientId, from: channels, on: commands.eventLoop)
        case .destroyed(let clientId, let reason):
            evictLocally(clientId, reason: Self.reason(named: reason))
        case .barrier(let n):
            let promise = state.withLockedValue { $0.barriers.removeValue(forKey: n) }
            promise?.succeed(())
        }
    }

    /// Gives a session that moved to `node` up, sending what was queued for it there (an empty handoff when it
    /// is already gone: the new node waits for one).
    func handOver(_ clientId: String, to node: String) {
        let queue = evictLocally(clientId, reason: .superseded) ?? []
        let handoff = NodeMessage.handoff(clientId: clientId, events: queue.map(\.json))
        _ = commands.send(RESPCommand(publishCommand, .string(channelPrefix + "n:" + node), .bytes(handoff.encoded())))
    }

    /// What the machine asked for after an event of the engine's life.
    func perform(_ action: RedisEngineStateMachine.Action) {
        switch action {
        case .none, .close:
            break
        case .subscribe:
            subscriber.sendWithoutReply([
                RESPCommand(sharded ? "SSUBSCRIBE" : "SUBSCRIBE", .string(notificationChannel))
            ])
        case .route(let outage):
            resynchronise(after: outage)
        case .fill(let fill):
            fillFromHistory(fill)
        case .scheduleFill:
            commands.eventLoop.scheduleTask(in: .milliseconds(100)) {
                self.perform(self.state.withLockedValue { $0.machine.fillDue() })
            }
        case .deliver(let messages):
            for message in messages { handle(message) }
        case .resume(let buffered, let found, let atCut):
            state.withLockedValue { s in
                s.redis.recoveredAfterCut += found.recovered
                s.redis.missedAfterCut += found.missed
            }
            if found.recovered > 0 || found.missed > 0 {
                logger.notice(
                    "notifications resumed",
                    metadata: [
                        "pubsub.redis.recovered": "\(found.recovered)", "pubsub.redis.missed": "\(found.missed)",
                    ])
            }
            // The gap is known once the history was read while listening: then the sessions of the cut are told,
            // before the events the history gave back (all after the hole) and the live ones reach anybody, so
            // that a client's positions stay before the hole and its resume says what is gone.
            if found.isGap { tellGap(atCut) }
            for recovered in found.events { dropOverflowed(local.enqueue(recovered.event, on: recovered.channel)) }
            for message in buffered { handle(message) }
        case .notificationsLost:
            resetLedger()
        case .outageBegan:
            resetLedger()
            // Whatever waits on a notification would wait for nothing.
            let (adopts, handoffs, barriers) = state.withLockedValue { s in
                defer {
                    s.adoptWaiters = [:]
                    s.handoffWaiters = [:]
                    s.barriers = [:]
                }
                return (s.adoptWaiters.values.flatMap { $0 }, Array(s.handoffWaiters.values), Array(s.barriers.values))
            }
            for p in adopts { p.fail(RedisError(.connectionClosed)) }
            for p in handoffs { p.succeed(()) }
            for p in barriers { p.fail(RedisError(.connectionClosed)) }
        }
    }

    /// Once both connections are back and this node's routing is in Redis again: delivers from the history what
    /// was published while this node was not listening; the machine then hands out what arrived meanwhile.
    /// Nothing twice, nothing out of order.
    func fillFromHistory(_ fill: UInt64) {
        let (after, afterEpoch) = state.withLockedValue { s in (s.delivered, s.deliveredEpoch ?? "") }
        let arguments: [RESPArgument] = [
            .integer(Int64(after)), .string(String(epochCandidate)), .string(afterEpoch), .string(positionKeyCandidate),
        ]
        eval(RedisScripts.history, arguments).whenComplete { result in
            var found = RedisEngineStateMachine.FillOutcome()
            if case .success(let reply) = result, let values = reply.array, values.count >= 3,
                let epochText = values[0].string, let last = values[1].int.map({ UInt64(max(0, $0)) })
            {
                if let key = values[2].string.flatMap({ PositionKey(text: $0) }) {
                    self.state.withLockedValue { $0.positionKey = key }
                }
                let (known, sameEpoch, delivered) = self.state.withLockedValue { s in
                    (s.deliveredEpoch != nil, s.deliveredEpoch == epochText, s.delivered)
                }
                if !known {
                    // First subscription: what was published before this node existed is not its business.
                    self.state.withLockedValue { s in
                        s.deliveredEpoch = epochText
                        s.delivered = last
                        s.epoch = UInt64(epochText)
                        s.lastSequence = max(s.lastSequence, last)
                    }
                } else {
                    let from = sameEpoch ? delivered : 0
                    if !sameEpoch {
                        found.lostData = true
                        self.logger.warning("Redis lost its data (new history epoch): positions start over")
                        self.state.withLockedValue { s in
                            s.deliveredEpoch = epochText
                            s.delivered = 0
                            s.epoch = UInt64(epochText)
                            s.lastSequence = last
                        }
                    }
                    var firstHeld: UInt64?
                    for entry in values.dropFirst(3) {
                        guard let buffer = entry.buffer else { continue }
                        var reader = NodeMessage.Reader(buffer: buffer)
                        guard let sequence = reader.integer(), reader.field() != nil, let channel = reader.string()
                        else { continue }
                        firstHeld = firstHeld ?? sequence
                        let fresh = self.state.withLockedValue { s -> Bool in
                            guard sequence > s.delivered else { return false }
                            s.delivered = sequence
                            return true
                        }
                        if fresh {
                            found.recovered += 1
                            found.events.append(.init(channel: channel, event: reader.buffer))
                        }
                    }
                    let firstNeeded = from + 1
                    if let firstHeld, firstHeld > firstNeeded {
                        found.missed = firstHeld - firstNeeded
                    } else if firstHeld == nil, last >= firstNeeded {
                        found.missed = last - from
                    }
                    self.state.withLockedValue { s in
                        s.delivered = max(s.delivered, last)
                        s.lastSequence = max(s.lastSequence, last)
                    }
                }
            } else if case .failure(let error) = result {
                self.logger.warning(
                    "could not read the history after reconnecting", metadata: ["pubsub.error": "\(error)"])
            }
            let outcome: RedisEngineStateMachine.FillOutcome? = if case .success = result { found } else { nil }
            self.perform(self.state.withLockedValue { $0.machine.fillFinished(fill, outcome) })
        }
    }

    func subscriberEvent(_ event: RedisClient.Event) {
        switch event {
        case .connected:
            perform(state.withLockedValue { $0.machine.notificationsConnected() })
        case .disconnected(let error):
            let resident = Set(local.snapshot().map(\.id))
            let action = state.withLockedValue { $0.machine.notificationsCut(resident: resident) }
            guard action != .none else { return }
            logger.warning("lost the Redis notification connection", metadata: ["pubsub.error": "\(error)"])
            perform(action)
        }
    }

    func commandsEvent(_ event: RedisClient.Event) {
        switch event {
        case .connected:
            perform(state.withLockedValue { $0.machine.commandsConnected() })
        case .disconnected(let error):
            let resident = Set(local.snapshot().map(\.id))
            let action = state.withLockedValue { s in
                let action = s.machine.commandsLost(now: .now(), resident: resident)
                if action == .outageBegan { s.redis.outages += 1 }
                return action
            }
            guard action != .none else { return }
            logger.error(
                "Redis unavailable: serving this node's clients only until it is back",
                metadata: ["pubsub.error": "\(error)", "pubsub.redis.url": "\(redisDescription)"])
            perform(action)
        }
    }

    /// After (re)connecting: puts this node's sessions and routing back (Redis may have restarted empty, or
    /// changes made during the outage were local only), and finishes destroys made meanwhile.
    func resynchronise(after outage: RedisEngineStateMachine.Outage?) {
        let destroys = state.withLockedValue { s in
            defer { s.pendingDestroys = [] }
            return s.pendingDestroys
        }
        if let outage {
            let seconds = Double((NIODeadline.now() - outage.since).nanoseconds) / 1e9
            logger.notice(
                "Redis is back",
                metadata: [
                    "pubsub.redis.outage_seconds": "\(seconds)",
                    "pubsub.redis.local_only_publishes": "\(outage.localPublishes)",
                ])
        }
        let now = NIODeadline.now()
        var work: [EventLoopFuture<Void>] = []
        for (id, reason) in destroys { work.append(destroyInRedis(id, reason: reason).map { _ in }) }
        let sessions = local.snapshot()
        for (id, subscriptions) in sessions {
            let arguments: [RESPArgument] =
                [.string(id), .string(node), expiry(now), .integer(Int64(subscriptions.count))]
                + subscriptions.map { .string($0) }
            work.append(
                eval(RedisScripts.register, arguments).map { reply in
                    // Claimed by another node while this one was away: its move notification may never come.
                    if let values = reply.array, values.first?.int == 0, let home = values.last?.string {
                        self.handOver(id, to: home)
                    } else if let values = reply.array, values.count > 1, values[1].int == 0 {
                        self.state.withLockedValue { $0.redis.sessionsRestored += 1 }
                    }
                })
        }
        EventLoopFuture.whenAllComplete(work, on: commands.eventLoop).whenComplete { _ in
            var counts: [String: Int] = [:]
            for (_, subscriptions) in self.local.snapshot() {
                for channel in subscriptions { counts[channel, default: 0] += 1 }
            }
            var arguments: [RESPArgument] = [.string(self.node), .integer(Int64(counts.count))]
            for (channel, count) in counts { arguments += [.string(channel), .integer(Int64(count))] }
            self.eval(RedisScripts.reroute, arguments).whenSuccess { _ in
                self.perform(self.state.withLockedValue { $0.machine.routingDone() })
            }
        }
    }
}

extension RedisEngine {
    /// Events were published that this node will never deliver (the history no longer held them after a cut, or
    /// Redis lost its data): which channels they were on is gone with them, so every session with a subscription
    /// that was resident when the cut began (`atCut`) is told, as one dropped for overflow: its held connect or
    /// its next fails with `advice: {reconnect: "handshake"}`, and its client handshakes again (and resumes from
    /// its positions, which says exactly what is gone). Never silence. A session that came later missed nothing.
    func tellGap(_ atCut: Set<String>) {
        let affected = local.snapshot().filter { !$0.subscriptions.isEmpty && atCut.contains($0.id) }.map(\.id)
        guard !affected.isEmpty else { return }
        for id in affected { local.evict(id, reason: .overflow) }
        state.withLockedValue { $0.redis.toldOfGap += UInt64(affected.count) }
        logger.warning(
            "sessions told of events they missed: they handshake again",
            metadata: ["pubsub.redis.sessions": "\(affected.count)"])
        dropOverflowed(affected)
    }
}
