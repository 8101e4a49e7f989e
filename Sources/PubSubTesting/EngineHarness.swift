import Bayeux
import NIOCore
import NIOPosix
import PubSubCore
import PubSubRedis
import Testing

/// The engines every conformance test runs against.
public enum EngineKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case memory
    case redis
    /// The Redis engine finding its master through a sentinel.
    case sentinel
    /// The Redis engine on a Redis Cluster of three masters (shared by the tests, each in a slot of its own).
    case redisCluster
    /// One service spread over three shards of that cluster, one per master (`RedisShardedEngine`).
    case redisShards
    public var testDescription: String { rawValue }
    /// Several nodes can share it.
    public var isRedis: Bool { self != .memory }
}

/// One broker node over either engine, driven with JSON text, with explicit time. Several nodes of the Redis
/// kind share one redis-server: a cluster in one process.
// @unchecked: test support: a test drives a node from one task at a time; `now` is its explicit clock.
public final class Node: @unchecked Sendable {
    public let loop: any EventLoop
    public let broker: Broker
    /// The Redis engine of the kinds with one; nil for the memory engine and for shards (`sharded`).
    public let redis: RedisEngine?
    public let sharded: RedisShardedEngine?
    public var now = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    public init(broker: Broker, redis: RedisEngine?, sharded: RedisShardedEngine? = nil, loop: any EventLoop) {
        self.broker = broker
        self.redis = redis
        self.sharded = sharded
        self.loop = loop
    }

    public var engine: any Engine { broker.engine }

    public func send(_ json: String, sink: (any DeliverySink)? = nil, type: ConnectionType = .longPolling) async throws
        -> [Outcome]
    {
        let elements = MessageBatch.elements(of: try JSONParser().parse(json))!
        let outcomes = try await broker.handle(
            elements, context: RequestContext(connectionType: type), sink: sink, now: now, on: loop
        ).get()
        // As a transport does (`Broker.split`): a connect answered now closes its session's batch as it is sent.
        for case .connect(let connect) in outcomes where connect.result.answerNow {
            var reply = connect.reply
            broker.closeBatch(&reply, for: connect)
        }
        return outcomes
    }

    /// A connect answered now, as a transport writes it (`Broker.split`: the reply with `ext.ack` for a client of
    /// the acknowledgement extension) and the data of the events that go with it.
    public func connectWritten(_ json: String, sink: (any DeliverySink)? = nil) async throws
        -> (reply: JSONObject, data: [JSONValue])
    {
        let elements = MessageBatch.elements(of: try JSONParser().parse(json))!
        let outcomes = try await broker.handle(
            elements, context: RequestContext(connectionType: .longPolling), sink: sink, now: now, on: loop
        ).get()
        let (replies, events, _) = broker.split(outcomes, context: RequestContext(connectionType: .longPolling))
        let data = events.map { try! JSONParser().parse($0.json).arrayValue![0].objectValue!["data"]! }
        return (replies.first?.fields ?? [:], data)
    }

    public func replies(_ json: String, sink: (any DeliverySink)? = nil) async throws -> [JSONObject] {
        try await send(json, sink: sink).compactMap { outcome in
            switch outcome {
            case .reply(let m): return m.fields
            case .connect(let c): return c.reply.fields
            case .none: return nil
            }
        }
    }

    public func reply(_ json: String, sink: (any DeliverySink)? = nil) async throws -> JSONObject {
        try await replies(json, sink: sink)[0]
    }

    public func handshake() async throws -> String {
        try await reply(#"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)[
            "clientId"]!.stringValue!
    }

    public func connect(_ clientId: String, sink: (any DeliverySink)? = nil, type: String = "long-polling") async throws
        -> PendingConnect?
    {
        let outcome = try await send(
            #"{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"\#(type)"}"#, sink: sink)[0]
        if case .connect(let c) = outcome { return c }
        return nil
    }

    public func connectReply(_ clientId: String) async throws -> JSONObject {
        try await reply(#"{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"long-polling"}"#)
    }

    /// The `data` of the events a sink-less connect returns.
    public func receive(_ clientId: String) async throws -> [JSONValue] {
        guard let c = try await connect(clientId) else { return [] }
        return c.result.events.map { try! JSONParser().parse($0.json).arrayValue![0].objectValue!["data"]! }
    }

    public func subscribe(_ clientId: String, _ channel: String, ext: String = "") async throws -> JSONObject {
        let e = ext.isEmpty ? "" : #","ext":\#(ext)"#
        return try await reply(
            #"{"channel":"/meta/subscribe","clientId":"\#(clientId)","subscription":"\#(channel)"\#(e)}"#)
    }

    public func publish(_ channel: String, _ data: String = "1") async throws -> JSONObject {
        try await reply(#"{"channel":"\#(channel)","data":\#(data)}"#)
    }

    public func sweep(at time: NIODeadline) async throws {
        if let redis {
            try await redis.sweepNow(now: time).get()
        } else if let sharded {
            try await sharded.sweepNow(now: time).get()
        } else {
            engine.sweep(now: time)
        }
    }

    /// Waits until every notification this node was sent has been handled and its deliveries have run.
    public func settle() async throws {
        if let redis { try await redis.settle().get() }
        if let sharded { try await sharded.settle().get() }
        try await loop.submit {}.get()
    }
}

/// Nodes of one kind; `close()` stops every engine and server.
// @unchecked: test support: a test drives its cluster from one task at a time; `nodes` changes only in `start`.
public final class Cluster: @unchecked Sendable {
    public let kind: EngineKind
    public let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    public private(set) var nodes: [Node] = []
    public let server: RedisServer?
    public let sentinel: RedisSentinelServer?
    /// `.redisCluster`: the shared cluster, and this test's key prefix (its hash tag picks the slot).
    public let redisCluster: RedisClusterServer?
    public let keyPrefix = "t" + String(ClientID.random().prefix(10)) + ":"
    public let configuration: BrokerConfiguration

    private init(
        kind: EngineKind, server: RedisServer?, sentinel: RedisSentinelServer?, redisCluster: RedisClusterServer?,
        configuration: BrokerConfiguration
    ) {
        self.kind = kind
        self.server = server
        self.sentinel = sentinel
        self.redisCluster = redisCluster
        self.configuration = configuration
    }

    public static func start(_ kind: EngineKind, nodes count: Int = 1, configuration: BrokerConfiguration = .init())
        async throws -> Cluster
    {
        let server = kind == .redis || kind == .sentinel ? try await RedisServer.start() : nil
        let redisCluster = kind == .redisCluster || kind == .redisShards ? try await RedisClusterServer.shared() : nil
        var sentinel: RedisSentinelServer?
        if kind == .sentinel, let server {
            do {
                sentinel = try await RedisSentinelServer.start(watching: server)
            } catch {
                server.stop()
                throw error
            }
        }
        let cluster = Cluster(
            kind: kind, server: server, sentinel: sentinel, redisCluster: redisCluster, configuration: configuration)
        for _ in 0..<count { try await cluster.addNode() }
        return cluster
    }

    @discardableResult
    public func addNode(handoffTimeout: TimeAmount = .seconds(1), sweepPeriod: TimeAmount = .zero) async throws -> Node
    {
        let loop = group.next()
        switch kind {
        case .memory:
            let broker = Broker(configuration: configuration, engine: MemoryEngine(configuration: configuration))
            let node = Node(broker: broker, redis: nil, loop: loop)
            nodes.append(node)
            return node
        case .redis, .sentinel, .redisCluster, .redisShards:
            var settings = RedisEngineConfiguration(
                redis: try RedisConfiguration(url: server?.url ?? "redis://127.0.0.1:1/0"), sweepPeriod: sweepPeriod,
                handoffTimeout: handoffTimeout)
            if let redisCluster {
                settings.cluster = RedisClusterConfiguration(seeds: redisCluster.seeds)
                settings.keyPrefix = keyPrefix
            }
            if let sentinel {
                // The master's address comes from the sentinel only: the URL's host and port are not used.
                settings.redis.port = 1
                settings.sentinel = RedisSentinelConfiguration(
                    sentinels: [sentinel.endpoint], masterName: sentinel.masterName)
            }
            if kind == .redisShards {
                let engine = RedisShardedEngine(
                    configuration: configuration, settings: settings,
                    map: try ShardMap(prefix: keyPrefix, count: 3))
                try await engine.start(timeout: .seconds(10)).get()
                let broker = Broker(configuration: configuration, engine: engine)
                let node = Node(broker: broker, redis: nil, sharded: engine, loop: loop)
                nodes.append(node)
                return node
            }
            let engine = RedisEngine(configuration: configuration, settings: settings)
            try await engine.start(timeout: .seconds(10)).get()
            let node = Node(broker: Broker(configuration: configuration, engine: engine), redis: engine, loop: loop)
            nodes.append(node)
            return node
        }
    }

    public var first: Node { nodes[0] }

    public func close() async {
        for node in nodes {
            await node.redis?.close()
            await node.sharded?.close()
        }
        sentinel?.stop()
        server?.stop()
        try? await group.shutdownGracefully()
    }
}

/// Runs `body` against a fresh cluster and always closes it.
public func withCluster(
    _ kind: EngineKind, nodes: Int = 1, configuration: BrokerConfiguration = .init(),
    _ body: (Cluster) async throws -> Void
) async throws {
    let cluster = try await Cluster.start(kind, nodes: nodes, configuration: configuration)
    do {
        try await body(cluster)
    } catch {
        await cluster.close()
        throw error
    }
    await cluster.close()
}
