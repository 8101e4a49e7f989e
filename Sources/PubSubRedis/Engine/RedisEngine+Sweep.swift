import Logging
import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

/// The expiry sweep, at most once per period for the whole cluster, and this node's heartbeat.
extension RedisEngine {
    public func sweep(now: NIODeadline) {
        _ = sweepNow(now: now)
    }

    /// The sweep, completing when Redis has answered (tests).
    public func sweepNow(now: NIODeadline) -> EventLoopFuture<Void> {
        state.withLockedValue { $0.ledger.prune(now: now) }
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
            .and(
                eval(
                    RedisScripts.sweep,
                    [
                        .string(node), .integer(milliseconds(now)), .integer(period),
                        .integer(Int64(settings.sweepBatch)),
                    ])
            )
            .map { replies, swept in
                let seq = replies.count > 1 ? replies[1].int.map { UInt64($0) } : nil
                // {id, user} of each session this sweep expired (older scripts answered with their ids, or their
                // number only).
                let expired = (swept.array ?? []).compactMap { entry -> (id: String, user: String?)? in
                    if let id = entry.string { return (id, nil) }
                    guard let pair = entry.array, let id = pair.first?.string else { return nil }
                    return (id, Self.user(in: pair.count > 1 ? pair[1] : nil))
                }
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
}
