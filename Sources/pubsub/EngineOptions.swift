import ArgumentParser
import Logging
import NIOCore
import PubSubCore
import PubSubRedis

/// `--engine memory|redis` and where Redis is: several `pubsub serve` nodes sharing one Redis form a cluster.
struct EngineOptions: ParsableArguments {
    @Option(help: "memory (one node) or redis (several nodes sharing sessions through Redis) (PUBSUB_ENGINE).")
    var engine: String?
    @Option(help: "redis://[[user]:password@]host[:port][/db] for --engine redis (PUBSUB_REDIS_URL).")
    var redisUrl: String?
    @Option(help: "Prefix of every Redis key; nodes with the same prefix and database form one cluster (PUBSUB_REDIS_PREFIX).")
    var redisPrefix: String?

    func validate() throws {
        let name = try resolvedEngine()
        if name != "redis", redisUrl != nil { throw ValidationError("--redis-url needs --engine redis") }
    }

    func resolvedEngine() throws -> String {
        let name = engine ?? Environment.string("PUBSUB_ENGINE") ?? "memory"
        guard name == "memory" || name == "redis" else { throw ValidationError("--engine must be memory or redis") }
        return name
    }

    /// The Redis engine, connected (or still trying, logged); nil for the memory engine.
    /// `events` (webhooks) hears of sessions starting, subscribing and ending on this node.
    func makeEngine(configuration: BrokerConfiguration, events: (any SessionEventObserver)? = nil, logger: Logger)
        async throws -> (any Engine)?
    {
        guard try resolvedEngine() == "redis" else {
            return events.map { MemoryEngine(configuration: configuration, events: $0, logger: logger) }
        }
        let url = redisUrl ?? Environment.string("PUBSUB_REDIS_URL") ?? "redis://127.0.0.1:6379/0"
        let redis: RedisConfiguration
        do {
            redis = try RedisConfiguration(url: url)
        } catch {
            throw ValidationError("\(error)")
        }
        var settings = RedisEngineConfiguration(redis: redis)
        if let prefix = redisPrefix ?? Environment.string("PUBSUB_REDIS_PREFIX") { settings.keyPrefix = prefix }
        let engine = RedisEngine(configuration: configuration, settings: settings, logger: logger, events: events)
        do {
            try await engine.start(timeout: .seconds(5)).get()
            logger.info(
                "redis engine: node \(settings.nodeID) on \(redis.redacted)",
                metadata: ["pubsub.redis.node": "\(settings.nodeID)"])
        } catch {
            // Serving this node's clients goes on; /readyz says not ready until Redis answers.
            logger.error("redis engine: \(redis.redacted) not reachable yet, retrying: \(error)")
        }
        return engine
    }
}
