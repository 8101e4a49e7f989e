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
    /// Prepended to every key; nodes sharing a prefix (and a database) form one cluster.
    public var keyPrefix: String
    /// This node's name in Redis; unique per process.
    public var nodeID: String
    /// The expiry sweep runs at most once per period across the cluster; 0 runs it at every `sweep` call.
    public var sweepPeriod: TimeAmount
    /// How long a connect waits for the queue of a session coming from another live node.
    public var handoffTimeout: TimeAmount
    /// Sessions expired per sweep, at most.
    public var sweepBatch: Int

    public init(
        redis: RedisConfiguration = .init(),
        keyPrefix: String = "pubsub:",
        nodeID: String = String(ClientID.random().prefix(12)),
        sweepPeriod: TimeAmount = .seconds(1),
        handoffTimeout: TimeAmount = .seconds(1),
        sweepBatch: Int = 1000,
        sentinel: RedisSentinelConfiguration? = nil
    ) {
        self.redis = redis
        self.sentinel = sentinel
        self.keyPrefix = keyPrefix
        self.nodeID = nodeID
        self.sweepPeriod = sweepPeriod
        self.handoffTimeout = handoffTimeout
        self.sweepBatch = sweepBatch
    }
}
