import Bayeux
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// The server API's engine questions, run against the memory engine and the Redis engine (two nodes on one
/// redis-server for the Redis kind: answers are cluster-wide whichever node is asked).
@Suite(.serialized, .timeLimit(.minutes(2))) struct EngineQueryConformanceTests {
    @Test(arguments: EngineKind.allCases)
    func channelsAndPresenceFollowSubscriptions(_ kind: EngineKind) async throws {
        try await withCluster(kind, nodes: kind.isRedis ? 2 : 1) { cluster in
            let h = cluster.first
            let other = cluster.nodes.last!
            let a = try await h.handshake()
            _ = try await h.connect(a)
            let b = try await other.handshake()
            // The transport is the connection the connect came on (the request context), as the server says it.
            _ = try await other.send(
                #"{"channel":"/meta/connect","clientId":"\#(b)","connectionType":"websocket"}"#, type: .websocket)
            _ = try await h.subscribe(a, "/room")
            _ = try await h.subscribe(a, "/jobs/**")
            _ = try await other.subscribe(b, "/room")
            for node in cluster.nodes {
                let counts = try await node.queries.channels(on: node.loop).get()
                #expect(
                    Dictionary(uniqueKeysWithValues: counts.map { ($0.channel, $0.subscribers) }) == [
                        "/room": 2, "/jobs/**": 1,
                    ])
                let present = try await node.queries.presence(of: "/room", now: node.now, on: node.loop).get()
                #expect(Set(present.map(\.clientId)) == [a, b])
                #expect(present.allSatisfy { $0.user == nil })
                let byId = Dictionary(uniqueKeysWithValues: present.map { ($0.clientId, $0.transport) })
                #expect(byId[b] == "websocket")
                #expect(byId[a] == "long-polling")
                #expect(try await node.queries.presence(of: "/jobs/1", now: node.now, on: node.loop).get().isEmpty)
            }
            _ = try await h.reply(#"{"channel":"/meta/unsubscribe","clientId":"\#(a)","subscription":"/room"}"#)
            let after = try await other.queries.presence(of: "/room", now: other.now, on: other.loop).get()
            #expect(after.map(\.clientId) == [b])
        }
    }

    /// Redis keeps an index for these questions (`m:<channel>`, `chans`). Redis left by a version without it (no
    /// index, no `pidx`) is indexed by the first question; an entry whose session is gone is pruned by presence.
    @Test func theIndexIsBuiltByTheFirstQuestionAfterAnUpgradeAndKeptAfter() async throws {
        try await withCluster(.redis) { cluster in
            let h = cluster.first
            let redis = try #require(h.redis)
            let p = redis.keyPrefix
            func send(_ command: RESPCommand) async throws -> RESPValue { try await redis.commands.send(command).get() }
            func counts() async throws -> [String: Int] {
                let counts = try await h.queries.channels(on: h.loop).get()
                return Dictionary(uniqueKeysWithValues: counts.map { ($0.channel, $0.subscribers) })
            }
            func present(_ channel: String) async throws -> Set<String> {
                Set(try await h.queries.presence(of: channel, now: h.now, on: h.loop).get().map(\.clientId))
            }
            let a = try await h.handshake()
            // The first session of an empty Redis: the index is complete from the start, nothing to build.
            #expect(try await send(RESPCommand("EXISTS", .string(p + "pidx"))).int == 1)
            let b = try await h.handshake()
            _ = try await h.subscribe(a, "/room")
            _ = try await h.subscribe(a, "/jobs/**")
            _ = try await h.subscribe(b, "/room")
            _ = try await send(
                RESPCommand(
                    "DEL", .string(p + "pidx"), .string(p + "chans"), .string(p + "m:/room"), .string(p + "m:/jobs/**"))
            )
            #expect(try await counts() == ["/room": 2, "/jobs/**": 1])
            #expect(try await present("/room") == [a, b])
            #expect(try await send(RESPCommand("EXISTS", .string(p + "pidx"))).int == 1)
            // An entry of a session that ended without the index being told (a node of the older version).
            _ = try await send(RESPCommand("SADD", .string(p + "m:/room"), "gone"))
            _ = try await send(RESPCommand("HINCRBY", .string(p + "chans"), "/room", 1))
            #expect(try await present("/room") == [a, b])
            #expect(try await send(RESPCommand("SISMEMBER", .string(p + "m:/room"), "gone")).int == 0)
            #expect(try await counts() == ["/room": 2, "/jobs/**": 1])
            // From then on every change keeps it: an unsubscribe, a subscribe, a session's end.
            _ = try await h.reply(#"{"channel":"/meta/unsubscribe","clientId":"\#(a)","subscription":"/room"}"#)
            _ = try await h.subscribe(b, "/jobs/**")
            _ = try await h.engine.destroyClient(a, reason: .disconnected, on: h.loop).get()
            #expect(try await counts() == ["/room": 1, "/jobs/**": 1])
            #expect(try await present("/jobs/**") == [b])
            _ = try await h.engine.destroyClient(b, reason: .disconnected, on: h.loop).get()
            #expect(try await counts() == [:])
            #expect(try await send(RESPCommand("EXISTS", .string(p + "chans"), .string(p + "m:/room"))).int == 0)
        }
    }

    @Test(arguments: EngineKind.allCases)
    func kickEndsTheSessionAndTellsItsSink(_ kind: EngineKind) async throws {
        try await withCluster(kind, nodes: kind.isRedis ? 2 : 1) { cluster in
            let home = cluster.nodes.last!
            let cid = try await home.handshake()
            let sink = RecordingSink(loop: home.loop, persistent: false)
            _ = try await home.connect(cid, sink: sink)
            _ = try await home.connect(cid, sink: sink)
            _ = try await home.subscribe(cid, "/k")
            #expect(try await cluster.first.broker.kick(cid, on: cluster.first.loop).get())
            try await home.settle()
            #expect(sink.detaches == [.kicked])
            #expect(try await home.queries.presence(of: "/k", now: home.now, on: home.loop).get().isEmpty)
            #expect(try await cluster.first.broker.kick(cid, on: cluster.first.loop).get() == false)
            // Its next connect, on any node, is told not to come back (not to handshake again).
            for node in cluster.nodes {
                let reply = try await node.connectReply(cid)
                #expect(reply["advice"] == Advice.none)
                #expect(reply["successful"] == false)
            }
            let stranger = try await home.connectReply("nosuchclient")
            #expect(stranger["advice"] == Advice.handshake)
        }
    }

    @Test(arguments: EngineKind.allCases)
    func historyAnswersAsResumeDoes(_ kind: EngineKind) async throws {
        try await withCluster(kind, configuration: BrokerConfiguration(historySize: 3)) { cluster in
            let h = cluster.first
            var positions: [String] = []
            for i in 0..<5 {
                let position = try await h.broker.publishFromAPI(
                    channel: "/h", data: JSONValue(i), ext: nil, now: h.now, on: h.loop
                ).get()
                positions.append(try #require(try position.get()))
            }
            let recent = try await h.queries.history(of: "/h", since: positions[2], limit: 10, now: h.now, on: h.loop)
                .get()
            #expect(recent.recovered && !recent.truncated)
            #expect(
                recent.events.map { try! JSONParser().parse($0.event).arrayValue![0].objectValue!["data"]! } == [3, 4])
            let paged = try await h.queries.history(of: "/h", since: positions[2], limit: 1, now: h.now, on: h.loop)
                .get()
            #expect(paged.recovered && paged.truncated && paged.events.count == 1)
            let old = try await h.queries.history(of: "/h", since: positions[0], limit: 10, now: h.now, on: h.loop)
                .get()
            #expect(!old.recovered && old.events.count == 3)
            let garbage = try await h.queries.history(of: "/h", since: "nonsense", limit: 10, now: h.now, on: h.loop)
                .get()
            #expect(!garbage.recovered && garbage.events.isEmpty)
            // Well-formed tokens this broker never made (of its epoch): each names some 64-bit sequence, about
            // half of them beyond what a signed integer holds. Answered, never a crash.
            let epoch = positions[0].split(separator: ".")[1]
            for n in 1...16 {
                let forged = "2.\(epoch).\(String(UInt64.max / 17 * UInt64(n), radix: 36))"
                let page = try await h.queries.history(of: "/h", since: forged, limit: 10, now: h.now, on: h.loop).get()
                #expect(!page.recovered)
            }
            let wildcard = try await h.queries.history(of: "/*", since: positions[3], limit: 10, now: h.now, on: h.loop)
                .get()
            // Over shards, an event's position speaks for its own shard only: `/*` spans them all.
            #expect(wildcard.recovered == (kind != .redisShards) && wildcard.events.map(\.channel) == ["/h"])
            // The engine's position (the handshake's) speaks for every shard.
            let now = try #require(h.engine.position)
            _ = try await h.broker.publishFromAPI(channel: "/h", data: JSONValue(5), ext: nil, now: h.now, on: h.loop)
                .get()
            let since = try await h.queries.history(of: "/*", since: now, limit: 10, now: h.now, on: h.loop).get()
            #expect(
                since.recovered
                    && since.events.map { try! JSONParser().parse($0.event).arrayValue![0].objectValue!["data"]! } == [
                        5
                    ])
        }
    }

    @Test(arguments: EngineKind.allCases)
    func nodesReportTheirSessions(_ kind: EngineKind) async throws {
        try await withCluster(kind, nodes: kind.isRedis ? 2 : 1) { cluster in
            for node in cluster.nodes {
                let cid = try await node.handshake()
                _ = try await node.connect(cid)
                _ = try await node.subscribe(cid, "/n")
            }
            let report = NodeReport(id: "x", uptimeSeconds: 1, clients: 0, clientsByTransport: [:], subscriptions: 0)
            for node in cluster.nodes { _ = try await node.queries.nodes(local: report, on: node.loop).get() }
            let reports = try await cluster.first.queries.nodes(local: report, on: cluster.first.loop).get()
            #expect(reports.count == cluster.nodes.count)
            #expect(reports.map(\.clients) == Array(repeating: 1, count: cluster.nodes.count))
            #expect(
                reports.allSatisfy { $0.clientsByTransport == ["long-polling": 1] && $0.subscriptions == 1 },
                "\(reports.map { ($0.id, $0.clients, $0.clientsByTransport, $0.subscriptions) })")
        }
    }

    /// The reports are found through the set of nodes, not by scanning the keyspace (each node stores its own
    /// once a second); a node whose report expired leaves the set when the next call meets it.
    @Test func aNodeWhoseReportExpiredLeavesTheSetOfNodes() async throws {
        try await withCluster(.redis, nodes: 2) { cluster in
            let redis = try #require(cluster.first.redis)
            let p = redis.keyPrefix
            let report = NodeReport(id: "x", uptimeSeconds: 1, clients: 0, clientsByTransport: [:], subscriptions: 0)
            for node in cluster.nodes { _ = try await node.queries.nodes(local: report, on: node.loop).get() }
            _ = try await redis.commands.send(RESPCommand("SADD", .string(p + "nodes"), "gone")).get()
            let reports = try await cluster.first.queries.nodes(local: report, on: cluster.first.loop).get()
            #expect(reports.count == 2)
            #expect(try await redis.commands.send(RESPCommand("SCARD", .string(p + "nodes"))).get().int == 2)
        }
    }
}

extension Node {
    /// The engine's answers to the server API's questions: every engine of the suite gives them.
    var queries: any EngineQueries {
        guard let queries = engine as? any EngineQueries else {
            fatalError("the \(type(of: engine)) engine does not answer the server API's questions")
        }
        return queries
    }
}
