/// What the Redis engine counts beyond `EngineStatistics`.
public struct RedisEngineStatistics: Sendable, Equatable {
    /// Times the command connection was lost.
    public var outages: UInt64 = 0
    /// Publishes made while Redis was unreachable: delivered to this node's subscribers only.
    public var localOnlyPublishes: UInt64 = 0
    /// Publishes refused while Redis was unreachable (`RedisEngineConfiguration.PublishWhileAway.refuse`).
    public var refusedPublishes: UInt64 = 0
    /// Publishes the master took but fewer replicas than `--redis-wait-replicas` confirmed in time: delivered,
    /// answered with an error, and exposed to a failover.
    public var unreplicatedPublishes: UInt64 = 0
    /// Publishes whose connection broke before Redis answered: they may or may not have been delivered.
    public var uncertainPublishes: UInt64 = 0
    /// Events found in the history after the notification connection was cut, and delivered late.
    public var recoveredAfterCut: UInt64 = 0
    /// Positions that went by while the notification connection was cut and that the history no longer held
    /// (an upper bound of what this node's subscribers missed).
    public var missedAfterCut: UInt64 = 0
    /// Sessions told they missed events (dropped, to handshake again) after such a gap or a Redis that lost its data.
    public var toldOfGap: UInt64 = 0
    /// Sessions that came from a node that did not hand their queue over in time.
    public var abandonedHandoffs: UInt64 = 0
    /// Sessions moved to this node.
    public var claims: UInt64 = 0
    /// Connects served without a script: the session was confirmed here, its expiry refreshed in a batch.
    public var batchedConnects: UInt64 = 0
    /// Batches sent (expiry refreshes and a barrier, for all the connects that came in meanwhile).
    public var connectBatches: UInt64 = 0
    /// Sessions expired by this node's sweeps (for the whole cluster).
    public var sweptSessions: UInt64 = 0
    /// Events received from Redis (one per publish that has a subscriber here, whatever their number).
    public var eventsReceived: UInt64 = 0
    /// Sessions of this node that Redis no longer had when the node put them back after a reconnect (Redis
    /// restarted empty, or a Sentinel failover promoted a replica that had not received them).
    public var sessionsRestored: UInt64 = 0
    /// Sentinel or Cluster: new masters this node moved to.
    public var failovers: UInt64 = 0
    /// Sentinel or Cluster: publishes of this node that were acknowledged by the old master but that the new master does
    /// not have (not replicated in time): gone from the history, though delivered when they were published.
    public var failoverLostPublishes: UInt64 = 0
    /// Sentinel or Cluster: positions this node had seen (delivered or published) beyond the new master's last one.
    public var failoverLostPositions: UInt64 = 0
    /// Cluster: scripts sent again because the engine's slot was moving or had moved.
    public var clusterRetries: UInt64 = 0
}
