import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

/// The `Engine` calls on sessions: creating one, connecting (moving it to this node when another holds it),
/// subscribing, unsubscribing, ending it.
extension RedisEngine {
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

    /// Holds here a session made in another engine (shard 0 of a `RedisShardedEngine`), under the same id.
    func createSession(_ id: String, now: NIODeadline) -> EventLoopFuture<Void> {
        local.adopt(id, subscriptions: [], connectedOnce: false, now: now)
        // Without Redis, it is registered when Redis is back (`resynchronise`).
        guard isConnected else { return commands.eventLoop.makeSucceededVoidFuture() }
        return eval(RedisScripts.create, [.string(id), .string(node), expiry(now)]).map { reply in
            // As at a handshake: the latest position of this shard, for the handshake's position.
            let values = reply.array ?? []
            if values.count > 3 {
                self.learn(
                    sequence: values[1].string.flatMap { UInt64($0) }, epoch: values[2].string.flatMap { UInt64($0) },
                    key: values[3].string.flatMap { PositionKey(text: $0) })
            }
        }.recover { _ in }
    }

    public func clientExists(_ clientId: String, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        if local.hasSession(clientId) { return loop.makeSucceededFuture(true) }
        return commands.send(RESPCommand("ZSCORE", .string(keyPrefix + "clients"), .string(clientId)))
            .map { !$0.isNull }.hop(to: loop)
    }

    public func connect(
        _ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt, on loop: any EventLoop
    ) -> EventLoopFuture<ConnectResult> {
        residentOrClaimed(clientId, now: now, refresh: true, on: loop).flatMap { status in
            guard status == .ok else { return self.refusedConnect(clientId, status: status, on: loop) }
            return self.local.connect(clientId, now: now, sink: sink, receipt: receipt, on: loop).map { result in
                // The resident session lost unconfirmed events and was dropped here: it ends in Redis too.
                if result.status == .overflowed { self.dropOverflowed([clientId]) }
                return result
            }
        }
    }

    /// The ledger is the resident session's (`MemoryEngine`): a session handed over to another node takes what its
    /// client has not confirmed along, as events to send first.
    public func closeBatch(_ clientId: String, connectId: JSONValue?) -> UInt64? {
        local.closeBatch(clientId, connectId: connectId)
    }

    public func attach(_ clientId: String, sink: any DeliverySink, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        residentOrClaimed(clientId, now: .now(), refresh: false, on: loop).flatMap { status in
            guard status == .ok else { return loop.makeSucceededFuture(false) }
            return self.local.attach(clientId, sink: sink, on: loop)
        }
    }

    public func detach(_ clientId: String, sink: any DeliverySink, takeEvents: Bool) -> CircularBuffer<WireEvent> {
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
        if refresh, let batched = joinBatch(clientId, now: now, on: loop) {
            // The batch resumes its connects on their own loops: the common case stays there.
            return batched.flatMap { passed -> EventLoopFuture<ConnectResult.Status> in
                guard passed else { return self.touch(clientId, now: now, refresh: refresh).hop(to: loop) }
                if self.local.hasSession(clientId) { return loop.makeSucceededFuture(.ok) }
                // Moved away meanwhile (its `M` came before the barrier): fetch it again.
                return self.claim(clientId, now: now, refresh: refresh).hop(to: loop)
            }
        }
        return touch(clientId, now: now, refresh: refresh).hop(to: loop)
    }

    /// The `touch` script: Redis says whether the session still lives here, and refreshes its expiry.
    func touch(_ clientId: String, now: NIODeadline, refresh: Bool) -> EventLoopFuture<ConnectResult.Status> {
        let arguments: [RESPArgument] = [.string(clientId), .string(node), expiry(now), refresh ? "1" : "0"]
        let generation = confirmationGeneration()
        return eval(RedisScripts.touch, arguments).flatMap { reply -> EventLoopFuture<ConnectResult.Status> in
            switch reply.array?.first?.int {
            case 1?:
                if self.local.hasSession(clientId) {
                    if refresh, let generation {
                        self.state.withLockedValue { $0.ledger.confirmed(clientId, now: now, generation: generation) }
                    }
                    return self.commands.eventLoop.makeSucceededFuture(.ok)
                }
                // Moved away and back between the check and now: fetch it again.
                return self.claim(clientId, now: now, refresh: refresh)
            case 3?:
                self.evictLocally(clientId, reason: .superseded)
                return self.claim(clientId, now: now, refresh: refresh)
            case 2?:
                self.evictLocally(clientId, reason: .overflow)
                return self.commands.eventLoop.makeSucceededFuture(.overflowed)
            default:
                self.evictLocally(clientId, reason: .disconnected)
                return self.commands.eventLoop.makeSucceededFuture(.unknownClient)
            }
        }.flatMapError { error in
            // Redis went away mid-request: the local session goes on serving.
            if self.local.hasSession(clientId) { return self.commands.eventLoop.makeSucceededFuture(.ok) }
            return self.commands.eventLoop.makeFailedFuture(error)
        }
    }

    /// Removes a session from this node, and from the sessions it serves without asking Redis.
    @discardableResult
    func evictLocally(_ clientId: String, reason: DetachReason) -> CircularBuffer<WireEvent>? {
        state.withLockedValue { $0.ledger.forget(clientId) }
        return local.evict(clientId, reason: reason)
    }

    /// The ledger generation a confirmation asked now belongs to; nil while the notification channel is not
    /// subscribed (a move told meanwhile would be lost, so Redis' answer cannot be trusted for later connects).
    func confirmationGeneration() -> UInt64? {
        state.withLockedValue { s in s.machine.isSubscribed ? s.ledger.generation : nil }
    }

    /// A connect for a session Redis confirmed here: waits for the next batch (its expiry refresh and the barrier
    /// behind it) instead of running `touch`. The future says true once the barrier came back, false when the
    /// connect must ask Redis after all (a cut); nil: not confirmed here, run `touch`. The future is on `loop`.
    func joinBatch(_ clientId: String, now: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<Bool>? {
        let waiter = loop.makePromise(of: Bool.self)
        let expiryMilliseconds = milliseconds(now) + lifetimeMilliseconds
        let decision = state.withLockedValue { s in
            let decision = s.ledger.connect(clientId, now: now, expiry: expiryMilliseconds, waiter: waiter)
            if case .wait = decision { s.redis.batchedConnects += 1 }
            return decision
        }
        switch decision {
        case .touch:
            waiter.succeed(false)
            return nil
        case .wait(let batch):
            if let batch { send(batch) }
            return waiter.futureResult
        }
    }

    /// Writes a batch: one `ZADD XX` per 500 expiries, then a barrier on this node's notification channel; its
    /// waiters go on when the barrier comes back. A failure (or nobody listening on the channel) resets the ledger.
    func send(_ batch: ResidencyLedger<EventLoopPromise<Bool>>.Batch) {
        let loop = commands.eventLoop
        let barrier = loop.makePromise(of: Void.self)
        let n = state.withLockedValue { s -> UInt64 in
            s.redis.connectBatches += 1
            s.nextBarrier += 1
            s.barriers[s.nextBarrier] = barrier
            return s.nextBarrier
        }
        var writes: [RESPCommand] = []
        var start = 0
        while start < batch.refreshes.count {
            let end = min(start + 500, batch.refreshes.count)
            var arguments: [RESPArgument] = ["ZADD", .string(keyPrefix + "clients"), "XX"]
            arguments.reserveCapacity(3 + 2 * (end - start))
            for (id, expiry) in batch.refreshes[start..<end] { arguments += [.integer(expiry), .string(id)] }
            writes.append(RESPCommand(arguments))
            start = end
        }
        writes.append(
            RESPCommand(publishCommand, .string(notificationChannel), .bytes(NodeMessage.barrier(n).encoded())))
        commands.send(writes).whenComplete { result in
            let delivered: Bool
            switch result {
            case .success(let replies):
                // (S)PUBLISH answers 0 when this node's channel has no listener: the barrier will never come.
                delivered =
                    replies.last?.int.map { $0 > 0 } ?? false
                    && !replies.contains { if case .error = $0 { return true } else { return false } }
            case .failure:
                delivered = false
            }
            if !delivered {
                self.state.withLockedValue { $0.barriers[n] = nil }
                barrier.fail(RedisError(.connectionClosed, "batch not delivered"))
            }
        }
        // A barrier lost on its way (published just as the notification connection closed) must not hold the
        // connects forever: after the command timeout they ask Redis.
        bounded(barrier.futureResult, by: settings.redis.commandTimeout) {
            self.state.withLockedValue { $0.barriers[n] = nil }
            return RedisError(.timeout, "no barrier back for a batch of connects")
        }.whenComplete { result in
            guard case .success = result else { return self.resetLedger() }
            let (waiters, next) = self.state.withLockedValue { $0.ledger.settled(batch.barrier) }
            if let next { self.send(next) }
            Self.resume(waiters, with: true)
        }
    }

    /// Resumes connects waiting for a batch: one task per event loop for all of that loop's connects, rather than
    /// one cross-thread hop each.
    static func resume(_ waiters: [EventLoopPromise<Bool>], with passed: Bool) {
        var byLoop: [ObjectIdentifier: (loop: any EventLoop, waiters: [EventLoopPromise<Bool>])] = [:]
        for waiter in waiters {
            let loop = waiter.futureResult.eventLoop
            byLoop[ObjectIdentifier(loop), default: (loop, [])].waiters.append(waiter)
        }
        for (loop, group) in byLoop.values {
            if loop.inEventLoop {
                for waiter in group { waiter.succeed(passed) }
            } else {
                loop.execute { for waiter in group { waiter.succeed(passed) } }
            }
        }
    }

    /// Forgets every confirmation (a Redis connection was cut, a notification may be lost); waiting connects run
    /// `touch`.
    func resetLedger() {
        Self.resume(state.withLockedValue { $0.ledger.reset() }, with: false)
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
        let generation = refresh ? confirmationGeneration() : nil
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
            var waits = [
                self.bounded(adopted.futureResult, by: self.settings.redis.commandTimeout) {
                    RedisError(.timeout, "session \(clientId) was not adopted")
                }
            ]
            if old != self.node && !old.isEmpty && oldAlive {
                waits.append(
                    self.bounded(handedOver.futureResult, by: self.settings.handoffTimeout) {
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
            return EventLoopFuture.andAllSucceed(waits, on: loop).map {
                if let generation, self.local.hasSession(clientId) {
                    self.state.withLockedValue { $0.ledger.confirmed(clientId, now: now, generation: generation) }
                }
                return .ok
            }
        }
    }

    /// `future`, or after `timeout` what `onTimeout` says: an error to fail with, or nil to go on.
    func bounded(
        _ future: EventLoopFuture<Void>, by timeout: TimeAmount, onTimeout: @escaping @Sendable () -> (any Error)?
    )
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
            let had = local.subscriptions(of: clientId) ?? []
            return local.subscribe(clientId, to: channels, resume: nil, now: now, on: loop).map { result, _ in
                var added = (self.local.subscriptions(of: clientId) ?? []).subtracting(had)
                self.reportSubscribed(
                    clientId, added: channels.filter { added.remove($0) != nil }, user: self.local.user(of: clientId))
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
        return eval(RedisScripts.subscribe, arguments).flatMap { reply in
            let outcome = self.subscribed(clientId, reply: reply, resume: resume, historyOn: historyOn)
            // A recovered resume's range reaches a session here through the `S` notification the script sent
            // before its reply: the reply waits for it, so that the client's next connect finds the range in
            // place of the copies it supersedes, and gets each event once.
            guard outcome.1?.recovered == true, self.local.hasSession(clientId) else {
                return self.commands.eventLoop.makeSucceededFuture(outcome)
            }
            return self.settle(within: self.settings.redis.commandTimeout).map { outcome }.recover { _ in outcome }
        }.hop(to: loop)
    }

    /// The subscribe script's answer: {1, limit, recovered, missed, user, added} or {2} (overflowed) or {0}.
    private func subscribed(_ clientId: String, reply: RESPValue, resume: String?, historyOn: Bool)
        -> (SubscriptionResult, ResumeResult?)
    {
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
            self.reportSubscribed(
                clientId, added: Self.channels(in: values.count > 5 ? values[5] : nil),
                user: Self.user(in: values.count > 4 ? values[4] : nil))
            return (result, resumed)
        case 2?: return (.overflowed, nil)
        default: return (.unknownClient, nil)
        }
    }

    public func unsubscribe(_ clientId: String, from channels: [String], on loop: any EventLoop)
        -> EventLoopFuture<SubscriptionResult>
    {
        guard isConnected else {
            guard local.hasSession(clientId) else { return loop.makeFailedFuture(RedisError(.notConnected)) }
            let had = local.subscriptions(of: clientId) ?? []
            return local.unsubscribe(clientId, from: channels, on: loop).map { result in
                if result == .ok {
                    var held = had
                    self.reportUnsubscribed(
                        clientId, removed: channels.filter { held.remove($0) != nil },
                        user: self.local.user(of: clientId))
                }
                return result
            }
        }
        let arguments: [RESPArgument] =
            [.string(clientId), .integer(Int64(channels.count))] + channels.map { .string($0) }
        return eval(RedisScripts.unsubscribe, arguments).map { reply -> SubscriptionResult in
            let values = reply.array ?? []
            switch values.first?.int {
            case 1?:
                self.reportUnsubscribed(
                    clientId, removed: Self.channels(in: values.count > 2 ? values[2] : nil),
                    user: Self.user(in: values.count > 1 ? values[1] : nil))
                return .ok
            case 2?: return .overflowed
            default: return .unknownClient
            }
        }.hop(to: loop)
    }

    public func destroyClient(_ clientId: String, reason: DetachReason, on loop: any EventLoop)
        -> EventLoopFuture<Bool>
    {
        let localUser = local.user(of: clientId)
        let wasLocal = evictLocally(clientId, reason: reason) != nil
        if reason == .kicked { rememberKicked(clientId) }
        guard isConnected else {
            guard wasLocal else { return loop.makeFailedFuture(RedisError(.notConnected)) }
            state.withLockedValue { $0.pendingDestroys.append((clientId, reason)) }
            reportEnded([(clientId, localUser)], reason)
            return loop.makeSucceededFuture(true)
        }
        return destroyInRedis(clientId, reason: reason).map { destroyed in
            if destroyed.destroyed || wasLocal { self.reportEnded([(clientId, destroyed.user ?? localUser)], reason) }
            return destroyed.destroyed || wasLocal
        }.hop(to: loop)
    }

    /// Whether the session was in Redis, and its user then.
    func destroyInRedis(_ clientId: String, reason: DetachReason) -> EventLoopFuture<(destroyed: Bool, user: String?)> {
        eval(RedisScripts.destroy, [.string(clientId), .string(Self.name(of: reason)), .integer(lifetimeMilliseconds)])
            .map { reply in
                let values = reply.array ?? [reply]
                return (values.first?.int == 1, Self.user(in: values.count > 1 ? values[1] : nil))
            }
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
}
