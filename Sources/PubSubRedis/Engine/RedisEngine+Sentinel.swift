import Logging
import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

/// Following a Sentinel failover. The connections find the master through the sentinels at every reconnect
/// (`SentinelMonitor`); a `+switch-master` announcement or a `READONLY` reply drops them at once. After that,
/// the engine repairs what it repairs after any Redis outage (`resynchronise`: this node's sessions, their
/// subscriptions and its routing are written again; the history is read for what the notification connection
/// missed). What is particular to a failover is done here, on the commands connection before it is used:
/// positions, and counting what the new master lacks.
///
/// Redis replicates asynchronously: a write acknowledged by the old master may not have reached the replica
/// that takes over. Such writes are lost: the events are gone from the history (they were delivered to the
/// subscribers of the time: notifications go out with the write), and sessions created or subscriptions changed
/// in that window are missing; the node that holds them puts them back (`sessions_restored`).
extension RedisEngine {
    /// Positions, when a node first reaches a new master (`P master` names another address): the new master's
    /// last position becomes the term's base (`P termbase`) and the counter jumps by the gap, so that no event
    /// published from now on takes a position that the old master gave to an event the new one never received
    /// (another node may still hold, or have delivered, that event). Nodes that come later see the same base.
    /// ARGV: this master's address, gap. Returns {new term (1/0), base, seq, epoch}.
    static let reseatScript = RedisScripts.Script(
        """
        local addr, gap = ARGV[3], tonumber(ARGV[4])
        local seq = tonumber(redis.call('GET', P .. 'seq') or '0')
        local epoch = redis.call('GET', P .. 'epoch') or ''
        local prev = redis.call('GET', P .. 'master')
        if prev == addr then
          return {0, tonumber(redis.call('GET', P .. 'termbase') or '0'), seq, epoch}
        end
        redis.call('SET', P .. 'termbase', seq)
        redis.call('SET', P .. 'master', addr)
        local base = seq
        if prev and epoch ~= '' then
          seq = seq + gap
          redis.call('SET', P .. 'seq', seq)
        end
        return {1, base, seq, epoch}
        """)

    /// Drops both connections now; they reconnect to the master the sentinels name.
    func rediscover(because reason: String) {
        logger.notice("Redis master changed: reconnecting", metadata: ["pubsub.redis.reason": "\(reason)"])
        commands.reconnectNow()
        subscriber.reconnectNow()
    }

    /// Runs on every new commands connection in Sentinel mode, after `ROLE` said master and before anything else
    /// is sent. When this node comes from another master: counts the positions it had seen and its acknowledged
    /// publishes that the new master does not have.
    func reseat(at endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<Void> {
        let gap = settings.failoverPositionGap
        let command = RESPCommand(
            ["EVAL", .string(Self.reseatScript.variant(sharded: sharded).source)] + scriptPrelude
                + [.string(endpoint.description), .integer(Int64(gap))])
        return send([command]).flatMapThrowing { replies in
            if case .error(let message) = replies[0] { throw RedisError(.server, "reseat: \(message)") }
            guard let values = replies[0].array, values.count == 4,
                let base = values[1].int.map({ UInt64(max(0, $0)) }),
                let seq = values[2].int.map({ UInt64(max(0, $0)) })
            else { throw RedisError(.protocolViolation, "reseat: unexpected reply") }
            let epoch = values[3].string.flatMap { UInt64($0) }
            let report = self.state.withLockedValue { s -> (positions: UInt64, publishes: UInt64)? in
                defer {
                    s.termMaster = endpoint
                    s.lastSequence = max(s.lastSequence, seq)
                }
                guard let previous = s.termMaster, previous != endpoint else { return nil }
                s.redis.failovers += 1
                let lost: (UInt64, UInt64)
                if let epoch, epoch == s.epoch {
                    let seen = max(s.lastSequence, s.delivered)
                    lost = (seen > base ? seen - base : 0, UInt64(s.acknowledged.lazy.filter { $0 > base }.count))
                } else {
                    // Another epoch: the new master has none of the old data; the epoch change says so already.
                    lost = (0, 0)
                }
                s.acknowledged.removeAll(keepingCapacity: true)
                s.redis.failoverLostPositions += lost.0
                s.redis.failoverLostPublishes += lost.1
                return lost
            }
            if let report {
                let level: Logger.Level = report.positions > 0 || report.publishes > 0 ? .warning : .notice
                self.logger.log(
                    level: level, "moved to a new Redis master",
                    metadata: [
                        "pubsub.redis.endpoint": "\(endpoint)",
                        "pubsub.redis.lost_positions": "\(report.positions)",
                        "pubsub.redis.lost_publishes": "\(report.publishes)",
                    ])
            }
            // The notification connection follows to the same master, should it still be on the old one.
            if let other = self.subscriber.endpoint, other != endpoint { self.subscriber.reconnectNow() }
        }
    }
}
