import Bayeux
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// The session's user (`setUser` / `user(of:)`) and grant (`setGrant` / `grant(of:)`), on every engine: set, read
/// back from any node, gone with the session.
@Suite(.serialized, .timeLimit(.minutes(2))) struct EngineUserConformanceTests {
    @Test(arguments: EngineKind.allCases)
    func userIsStoredWithTheSessionAndGoesWithIt(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            #expect(try await h.engine.user(of: cid, on: h.loop).get() == nil)
            try await h.engine.setUser(cid, user: "42", on: h.loop).get()
            #expect(try await h.engine.user(of: cid, on: h.loop).get() == "42")
            try await h.engine.setUser(cid, user: "user:é 43", on: h.loop).get()
            #expect(try await h.engine.user(of: cid, on: h.loop).get() == "user:é 43")
            #expect(try await h.engine.destroyClient(cid, reason: .disconnected, on: h.loop).get())
            #expect(try await h.engine.user(of: cid, on: h.loop).get() == nil)
            // An unknown client gets no user, and setting one does not create a session.
            try await h.engine.setUser("nosuchclient", user: "7", on: h.loop).get()
            #expect(try await h.engine.user(of: "nosuchclient", on: h.loop).get() == nil)
            #expect(try await !h.engine.clientExists("nosuchclient", on: h.loop).get())
        }
    }

    @Test func userSetOnOneNodeIsReadOnAnother() async throws {
        try await withCluster(.redis, nodes: 2) { cluster in
            let (a, b) = (cluster.nodes[0], cluster.nodes[1])
            let cid = try await a.handshake()
            try await a.engine.setUser(cid, user: "alice", on: a.loop).get()
            #expect(try await b.engine.user(of: cid, on: b.loop).get() == "alice")
        }
    }

    @Test(arguments: EngineKind.allCases)
    func grantIsStoredWithTheSessionAndGoesWithIt(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            #expect(try await h.engine.grant(of: cid, on: h.loop).get() == nil)
            let grant = SessionGrant(user: "42", expiresAt: 1_900_000_000, channels: ["/jobs/42"], publish: ["/a/**"])
            try await h.engine.setGrant(cid, grant: grant.encoded, on: h.loop).get()
            let stored = try #require(try await h.engine.grant(of: cid, on: h.loop).get())
            #expect(SessionGrant(encoded: stored) == grant)
            #expect(try await h.engine.destroyClient(cid, reason: .expired, on: h.loop).get())
            #expect(try await h.engine.grant(of: cid, on: h.loop).get() == nil)
            try await h.engine.setGrant("nosuchclient", grant: grant.encoded, on: h.loop).get()
            #expect(try await h.engine.grant(of: "nosuchclient", on: h.loop).get() == nil)
        }
    }

    @Test func grantSetOnOneNodeIsReadOnAnother() async throws {
        try await withCluster(.redis, nodes: 2) { cluster in
            let (a, b) = (cluster.nodes[0], cluster.nodes[1])
            let cid = try await a.handshake()
            let grant = SessionGrant(user: "alice", expiresAt: nil, channels: ["/x"])
            try await a.engine.setGrant(cid, grant: grant.encoded, on: a.loop).get()
            #expect(try await b.engine.grant(of: cid, on: b.loop).get().flatMap(SessionGrant.init(encoded:)) == grant)
        }
    }

    @Test func aNodeKeepsItsCopyWhenRedisLosesTheFields() async throws {
        try await withCluster(.redis) { cluster in
            let h = cluster.first
            let engine = try #require(h.engine as? RedisEngine)
            let cid = try await h.handshake()
            try await engine.setUser(cid, user: "42", on: h.loop).get()
            try await engine.setGrant(cid, grant: SessionGrant(user: "42").encoded, on: h.loop).get()
            // As after a Redis restart that lost the data: the session is registered again without its fields.
            _ = try await engine.commands.send(
                RESPCommand("HDEL", .string(engine.keyPrefix + "c:" + cid), "user", "grant")
            ).get()
            #expect(try await engine.user(of: cid, on: h.loop).get() == "42")
            #expect(
                try await engine.grant(of: cid, on: h.loop).get().flatMap(SessionGrant.init(encoded:))?.user == "42")
        }
    }
}
