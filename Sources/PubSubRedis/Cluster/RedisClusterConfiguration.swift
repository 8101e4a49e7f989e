/// Redis Cluster: the nodes to ask where the engine's slot is.
///
/// The engine keeps all of its keys under one hash tag, so they live in one slot of one shard; the cluster gives
/// that shard a replica that takes over when its master fails, and the rest of the cluster can serve other
/// applications. See docs/CLUSTER.md.
public struct RedisClusterConfiguration: Sendable {
    /// Where to ask for the slot map (`CLUSTER SLOTS`): any nodes of the cluster; those it names are asked too.
    public var seeds: [RedisEndpoint]
    /// How to talk to the nodes (password, TLS); host and port are not used.
    public var connection: RedisConfiguration
    /// Positions skipped when the first broker reaches a new master of the slot, as with Sentinel.
    public var failoverPositionGap: UInt64

    public init(
        seeds: [RedisEndpoint], connection: RedisConfiguration = .init(), failoverPositionGap: UInt64 = 1_000_000
    ) {
        self.seeds = seeds
        self.connection = connection
        self.failoverPositionGap = failoverPositionGap
    }

    public typealias ParseError = RedisEndpointList.ParseError

    /// Reads `--redis-cluster`: `host[:port],…` (port 6379 by default) or `redis[s]://[[user]:password@]host[:port]`
    /// each. A database cannot be chosen: a cluster has only database 0.
    public static func parse(_ list: String) throws -> RedisClusterConfiguration {
        let (seeds, connection) = try RedisEndpointList.parse(list, defaultPort: 6379, noun: "cluster node")
        guard connection.database == 0 else {
            throw ParseError(description: "a Redis Cluster has only database 0")
        }
        return RedisClusterConfiguration(seeds: seeds, connection: connection)
    }

    /// The key prefix used in the cluster: the prefix itself when it has a hash tag (`{…}`), else the prefix
    /// inside one (`pubsub:` becomes `{pubsub:}`), so that every key of the engine is in one slot.
    public static func taggedPrefix(_ prefix: String) -> String {
        ClusterSlot.tag(of: prefix) == nil ? "{" + prefix + "}" : prefix
    }
}
