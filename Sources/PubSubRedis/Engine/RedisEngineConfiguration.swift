import Bayeux
import NIOCore
import PubSubCore

/// Settings of the Redis engine beyond the broker's own.
public struct RedisEngineConfiguration: Sendable {
    /// The Redis server; with `sentinel`, how to talk to the master (password, database, TLS), whose address
    /// the sentinels give.
    public var redis: RedisConfiguration
    /// Redis Sentinel: the master is found through the sentinels and followed through failovers.
    public var sentinel: RedisSentinelConfiguration?
    /// Redis Cluster: the engine's slot is found through the cluster's nodes and followed through failovers;
    /// `redis` then says how to talk to the nodes (password, TLS).
    public var cluster: RedisClusterConfiguration?
    /// Prepended to every key; nodes sharing a prefix (and a database) form one cluster. In Redis Cluster it is
    /// put inside a hash tag unless it has one (`RedisClusterConfiguration.taggedPrefix`).
    public var keyPrefix: String
    /// This node's name in Redis; unique per process.
    public var nodeID: String
    /// The expiry sweep runs at most once per period across the cluster; 0 runs it at every `sweep` call.
    public var sweepPeriod: TimeAmount
    /// How long a connect waits for the queue of a session coming from another live node.
    public var handoffTimeout: TimeAmount
    /// Sessions expired per sweep, at most.
    public var sweepBatch: Int
    /// What a publish does while this node cannot write to Redis.
    public var whenAway: PublishWhileAway = .refuse
    /// Replicas that must hold a publish before it is acknowledged (`WAIT`, sent with the publish on the same
    /// connection); 0: the master's answer is enough.
    public var waitReplicas: Int = 0
    /// How long a publish waits for `waitReplicas`; one not confirmed in time is answered with an error (it was
    /// delivered, and a failover may lose it from the history). Kept under the connection's command timeout.
    public var waitTimeout: TimeAmount = .seconds(1)

    public init(
        redis: RedisConfiguration = .init(),
        keyPrefix: String = "pubsub:",
        nodeID: String = String(ClientID.random().prefix(12)),
        sweepPeriod: TimeAmount = .seconds(1),
        handoffTimeout: TimeAmount = .seconds(1),
        sweepBatch: Int = 1000,
        sentinel: RedisSentinelConfiguration? = nil,
        cluster: RedisClusterConfiguration? = nil
    ) {
        self.redis = redis
        self.sentinel = sentinel
        self.cluster = cluster
        self.keyPrefix = keyPrefix
        self.nodeID = nodeID
        self.sweepPeriod = sweepPeriod
        self.handoffTimeout = handoffTimeout
        self.sweepBatch = sweepBatch
    }

    /// What a publish does while the node cannot write to Redis: its connection is down (an outage, a master that
    /// died and is not yet replaced) or the server it writes to was demoted to a replica (`READONLY`).
    public enum PublishWhileAway: String, Sendable, CaseIterable {
        /// Refused with `PublishRefused`, which the publisher can retry: nothing is acknowledged that the other
        /// nodes' subscribers would never get, without a word, and that no resume could recover.
        case refuse
        /// Delivered to this node's subscribers only and acknowledged without a position
        /// (`pubsub_redis_local_only_publishes_total`): the other nodes' subscribers never get it, untold.
        case local
    }

    /// Positions skipped when the first node reaches a new master after a failover (Sentinel or Cluster).
    var failoverPositionGap: UInt64 { sentinel?.failoverPositionGap ?? cluster?.failoverPositionGap ?? 0 }
}
