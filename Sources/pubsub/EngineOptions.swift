import ArgumentParser
import Foundation
import Logging
import NIOCore
import PubSubCore
import PubSubRedis

/// `--engine memory|redis` and where Redis is: several `pubsub serve` nodes sharing one Redis form a cluster.
struct EngineOptions: ParsableArguments {
    @Option(help: "memory (one node) or redis (several nodes sharing sessions through Redis) (PUBSUB_ENGINE).")
    var engine: EngineKind?
    @Option(help: "redis[s]://[[user]:password@]host[:port][/db] for --engine redis (PUBSUB_REDIS_URL).")
    var redisUrl: String?
    @Option(
        help:
            "Prefix of every Redis key; nodes with the same prefix and database form one cluster (PUBSUB_REDIS_PREFIX)."
    )
    var redisPrefix: String?
    @Option(
        help: ArgumentHelp(
            "Redis Sentinel instead of --redis-url: host:port,host:port (or redis[s]://[:password@]host:port each) (PUBSUB_REDIS_SENTINELS).",
            valueName: "sentinels"))
    var redisSentinels: String?
    @Option(
        help: ArgumentHelp(
            "The master's name at the sentinels; redis[s]://[[user]:password@]NAME[/db] for its password, database, TLS (PUBSUB_REDIS_MASTER_NAME).",
            valueName: "name"))
    var redisMasterName: String?
    @Option(
        help: ArgumentHelp(
            "Redis Cluster instead of --redis-url: host:port,host:port of any of its nodes (or redis[s]://[[user]:password@]host:port each) (PUBSUB_REDIS_CLUSTER).",
            valueName: "nodes"))
    var redisCluster: String?
    @Option(
        help: ArgumentHelp(
            "With --redis-cluster: spread the channels over this many shards, each on a slot of its own (PUBSUB_REDIS_SHARDS; default 1).",
            valueName: "n"))
    var redisShards: Int?
    @Option(
        help: ArgumentHelp(
            "With --redis-shards: how many leading segments of a channel pick its shard (PUBSUB_REDIS_SHARD_SEGMENTS; default 1).",
            valueName: "k"))
    var redisShardSegments: Int?
    @Option(help: "PEM file of the CAs to trust for rediss:// instead of the system's (PUBSUB_REDIS_CA_FILE).")
    var redisCaFile: String?
    @Option(
        help: ArgumentHelp(
            "A publish while this node cannot write to Redis: refused, for the publisher to retry, or delivered to this node's subscribers only (PUBSUB_REDIS_WHEN_AWAY; default refuse).",
            valueName: "refuse|local"))
    var redisWhenAway: String?
    @Option(
        help: ArgumentHelp(
            "Acknowledge a publish only once this many Redis replicas hold it (WAIT) (PUBSUB_REDIS_WAIT_REPLICAS; default 0).",
            valueName: "n"))
    var redisWaitReplicas: Int?
    @Option(
        help: ArgumentHelp(
            "With --redis-wait-replicas: seconds a publish waits for them before it is answered with an error (PUBSUB_REDIS_WAIT_TIMEOUT; default 1).",
            valueName: "seconds"))
    var redisWaitTimeout: Double?

    func validate() throws {
        let memory = try resolvedEngine() == .memory
        if memory, redisUrl != nil { throw ValidationError("--redis-url needs --engine redis") }
        if memory, redisSentinels != nil { throw ValidationError("--redis-sentinels needs --engine redis") }
        if memory, redisCluster != nil { throw ValidationError("--redis-cluster needs --engine redis") }
        if memory, redisWhenAway != nil { throw ValidationError("--redis-when-away needs --engine redis") }
        _ = try resolvedRedis()
        _ = try resolvedShards()
        _ = try resolvedWhenAway()
        _ = try resolvedWait()
        if memory, redisWaitReplicas != nil || redisWaitTimeout != nil {
            throw ValidationError("--redis-wait-replicas and --redis-wait-timeout need --engine redis")
        }
    }

    /// `--redis-wait-replicas` and `--redis-wait-timeout`.
    func resolvedWait() throws -> (replicas: Int, timeout: TimeAmount) {
        let replicas = try Environment.pick(redisWaitReplicas, "PUBSUB_REDIS_WAIT_REPLICAS", 0)
        let seconds = try Environment.pick(redisWaitTimeout, "PUBSUB_REDIS_WAIT_TIMEOUT", 1)
        guard replicas >= 0 else { throw ValidationError("--redis-wait-replicas must not be negative") }
        guard seconds > 0, seconds <= 4 else {
            throw ValidationError("--redis-wait-timeout must be more than 0 and at most 4 seconds")
        }
        return (replicas, .nanoseconds(Int64(seconds * 1e9)))
    }

    /// `--redis-when-away`.
    func resolvedWhenAway() throws -> RedisEngineConfiguration.PublishWhileAway {
        let text = try Environment.pick(redisWhenAway, "PUBSUB_REDIS_WHEN_AWAY", "refuse")
        guard let value = RedisEngineConfiguration.PublishWhileAway(rawValue: text) else {
            throw ValidationError("--redis-when-away must be refuse or local, not '\(text)'")
        }
        return value
    }

    /// `--redis-shards` and `--redis-shard-segments` as a shard map; nil without shards.
    func resolvedShards() throws -> ShardMap? {
        let count = try Environment.pick(redisShards, "PUBSUB_REDIS_SHARDS")
        let segments = try Environment.pick(redisShardSegments, "PUBSUB_REDIS_SHARD_SEGMENTS")
        guard count != nil || segments != nil else { return nil }
        guard try resolvedEngine() == .redis, try Environment.pick(redisCluster, "PUBSUB_REDIS_CLUSTER") != nil else {
            throw ValidationError("--redis-shards and --redis-shard-segments need --redis-cluster")
        }
        let prefix = try Environment.pick(redisPrefix, "PUBSUB_REDIS_PREFIX", RedisEngineConfiguration().keyPrefix)
        do {
            return try ShardMap(prefix: prefix, count: count ?? 1, segments: segments ?? 1)
        } catch {
            throw ValidationError("--redis-shards: \(error)")
        }
    }

    /// Where Redis is: one server (a URL) or the sentinels and the master's name.
    enum RedisTarget {
        case server(RedisConfiguration)
        case sentinel(RedisSentinelConfiguration, master: RedisConfiguration)
        case cluster(RedisClusterConfiguration)
    }

    func resolvedRedis() throws -> RedisTarget {
        let url = try Environment.pick(redisUrl, "PUBSUB_REDIS_URL")
        let sentinels = try Environment.pick(redisSentinels, "PUBSUB_REDIS_SENTINELS")
        let masterName = try Environment.pick(redisMasterName, "PUBSUB_REDIS_MASTER_NAME")
        let caFile = try Environment.pick(redisCaFile, "PUBSUB_REDIS_CA_FILE")
        let clusterNodes = try Environment.pick(redisCluster, "PUBSUB_REDIS_CLUSTER")
        if clusterNodes != nil, url != nil || sentinels != nil {
            throw ValidationError(
                "--redis-cluster (PUBSUB_REDIS_CLUSTER) cannot be used with --redis-url or --redis-sentinels: one Redis server, the sentinels, or the cluster's nodes"
            )
        }
        if url != nil, sentinels != nil {
            throw ValidationError(
                "--redis-url (PUBSUB_REDIS_URL) and --redis-sentinels (PUBSUB_REDIS_SENTINELS) cannot be used together: one Redis server, or the sentinels that name the master"
            )
        }
        if sentinels == nil, masterName != nil {
            throw ValidationError("--redis-master-name needs --redis-sentinels")
        }
        if let caFile, !FileManager.default.isReadableFile(atPath: caFile) {
            throw ValidationError("--redis-ca-file: cannot read \(caFile)")
        }
        if let clusterNodes {
            do {
                var cluster = try RedisClusterConfiguration.parse(clusterNodes)
                cluster.connection.caFile = caFile
                return .cluster(cluster)
            } catch {
                throw ValidationError("--redis-cluster: \(error)")
            }
        }
        if let sentinels {
            guard let masterName else {
                throw ValidationError("--redis-sentinels needs --redis-master-name (the name the sentinels monitor)")
            }
            do {
                var (settings, master) = try RedisSentinelConfiguration.parse(
                    sentinels: sentinels, masterName: masterName)
                master.caFile = caFile
                settings.sentinelConnection.caFile = caFile
                return .sentinel(settings, master: master)
            } catch {
                throw ValidationError("--redis-sentinels: \(error)")
            }
        }
        do {
            var redis = try RedisConfiguration(url: url ?? "redis://127.0.0.1:6379/0")
            redis.caFile = caFile
            return .server(redis)
        } catch {
            throw ValidationError("\(error)")
        }
    }

    func resolvedEngine() throws -> EngineKind {
        try Environment.pick(engine, "PUBSUB_ENGINE", .memory)
    }

    /// The Redis engine, connected (or still trying, logged); nil for the memory engine.
    /// `events` (webhooks) hears of sessions starting, subscribing and ending on this node.
    func makeEngine(configuration: BrokerConfiguration, events: (any SessionEventObserver)? = nil, logger: Logger)
        async throws -> (any Engine)?
    {
        guard try resolvedEngine() == .redis else {
            return events.map { MemoryEngine(configuration: configuration, events: $0, logger: logger) }
        }
        var settings: RedisEngineConfiguration
        switch try resolvedRedis() {
        case .server(let redis):
            settings = RedisEngineConfiguration(redis: redis)
        case .sentinel(let sentinel, let master):
            settings = RedisEngineConfiguration(redis: master, sentinel: sentinel)
        case .cluster(let cluster):
            settings = RedisEngineConfiguration(redis: cluster.connection, cluster: cluster)
        }
        if let prefix = try Environment.pick(redisPrefix, "PUBSUB_REDIS_PREFIX") { settings.keyPrefix = prefix }
        settings.whenAway = try resolvedWhenAway()
        (settings.waitReplicas, settings.waitTimeout) = try resolvedWait()
        let engine: any Engine
        let started: EventLoopFuture<Void>
        let description: String
        if let map = try resolvedShards(), map.count > 1 {
            let sharded = RedisShardedEngine(
                configuration: configuration, settings: settings, map: map, logger: logger, events: events)
            (engine, started, description) = (sharded, sharded.start(timeout: .seconds(5)), sharded.redisDescription)
        } else {
            let single = RedisEngine(configuration: configuration, settings: settings, logger: logger, events: events)
            (engine, started, description) = (single, single.start(timeout: .seconds(5)), single.redisDescription)
        }
        do {
            try await started.get()
            logger.info(
                "redis engine: node \(settings.nodeID) on \(description)",
                metadata: ["pubsub.redis.node": "\(settings.nodeID)"])
        } catch {
            // Serving this node's clients goes on; /readyz says not ready until Redis answers.
            logger.error("redis engine: \(description) not reachable yet, retrying: \(error)")
        }
        return engine
    }
}
