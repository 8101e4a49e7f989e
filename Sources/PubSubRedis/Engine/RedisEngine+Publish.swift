import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

/// Publishing: one script run in Redis; while Redis is away, refused or (`--redis-when-away local`) delivered to
/// this node's subscribers only. Clients whose queue overflowed are dropped here and in Redis.
extension RedisEngine {
    public func publish(_ message: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<String?>
    {
        guard isConnected else {
            return loop.makeCompletedFuture { try publishWhileAway(message, to: channel, because: "not connected") }
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
                tail = head.getSlice(
                    at: at + positionMarker.utf8.count, length: head.writerIndex - at - positionMarker.utf8.count)!
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
        return eval(RedisScripts.publish, arguments, replicas: settings.waitReplicas).map { reply -> String? in
            let values = reply.array ?? []
            let sequence = values.first?.int.map { UInt64($0) } ?? 0
            let epoch = values.count > 1 ? values[1].string.flatMap { UInt64($0) } : nil
            let key = values.count > 2 ? values[2].string.flatMap { PositionKey(text: $0) } : nil
            self.state.withLockedValue { s in
                s.published += 1
                if self.sentinel != nil || self.cluster != nil, sequence > 0 {
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
            if let e = error as? RedisError,
                e.code == .notConnected || (e.code == .server && e.message.hasPrefix("READONLY"))
            {
                // Never sent (the connection went down just before), or refused by a master demoted to a replica
                // (Sentinel; the connection is dropped and the master found again): it did not happen in Redis.
                return try self.publishWhileAway(
                    message, to: channel, because: e.code == .notConnected ? "not connected" : "master demoted")
            }
            let unreplicated = (error as? RedisError)?.code == .notReplicated
            self.state.withLockedValue { s in
                if unreplicated {
                    s.redis.unreplicatedPublishes += 1
                } else {
                    s.redis.uncertainPublishes += 1
                }
            }
            throw PublishUncertain(
                reason: unreplicated
                    ? "Redis took and delivered the event, but \(error) (--redis-wait-replicas): a failover may lose it"
                    : "the connection to Redis broke before it answered (\(error)): the event may or may not have been delivered"
            )
        }.hop(to: loop)
    }

    /// Redis is away: the publish is refused, or this node's subscribers get the event now (other nodes never
    /// will; counted, logged).
    func publishWhileAway(_ message: Message, to channel: String, because reason: String) throws -> String? {
        guard settings.whenAway == .local else {
            state.withLockedValue { $0.redis.refusedPublishes += 1 }
            throw PublishRefused(reason: "Redis is unreachable (\(reason)); nothing was delivered, publish again")
        }
        dropOverflowed(
            local.enqueue(WireEvent(encoding: message, compression: configuration.eventCompression), on: channel))
        state.withLockedValue { s in
            s.published += 1
            s.redis.localOnlyPublishes += 1
            s.machine.publishedLocally()
        }
        return nil
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

    /// Clients whose local queue overflowed: dropped locally already, now in Redis too (which says their user).
    func dropOverflowed(_ ids: [String]) {
        guard !ids.isEmpty else { return }
        for id in ids {
            if isConnected {
                destroyInRedis(id, reason: .overflow).whenComplete { result in
                    let user = (try? result.get())?.user
                    self.reportEnded([(id, user)], .overflow)
                }
            } else {
                state.withLockedValue { $0.pendingDestroys.append((id, .overflow)) }
                reportEnded([(id, nil)], .overflow)
            }
        }
    }
}
