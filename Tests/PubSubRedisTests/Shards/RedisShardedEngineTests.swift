import Bayeux
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// What only an engine over shards does, on the shared three-master cluster.
@Suite(.serialized, .timeLimit(.minutes(2))) struct RedisShardedEngineTests {
    /// A shard that lost a session (its Redis restarted empty, its expiry passed there first) cannot route the
    /// session's events any more: the session ends everywhere and the client is told to handshake again, rather
    /// than silently missing that shard's channels.
    @Test func aSessionOneShardLostEndsEverywhere() async throws {
        try await withCluster(.redisShards) { cluster in
            let h = cluster.first
            let engine = try #require(h.sharded)
            let cid = try await h.handshake()
            _ = try await h.connect(cid)
            #expect(try await h.subscribe(cid, "/**")["successful"] == true)
            _ = try await engine.shards[2].destroyClient(cid, reason: .expired, on: h.loop).get()
            let reply = try await h.connectReply(cid)
            #expect(reply["error"] == .string("401:\(cid):Unknown client"))
            #expect(reply["advice"] == json(#"{"reconnect":"handshake"}"#))
            #expect(try await engine.clientExists(cid, on: h.loop).get() == false)
            #expect(try await engine.shards[1].clientExists(cid, on: h.loop).get() == false)
        }
    }

    /// Every shard holds the session from the handshake on, and a channel's subscription is held by shard 0 and
    /// by the channel's shard only; `/**` by all of them.
    @Test func subscriptionsAreHeldWhereTheirChannelsLive() async throws {
        try await withCluster(.redisShards) { cluster in
            let h = cluster.first
            let engine = try #require(h.sharded)
            let cid = try await h.handshake()
            for shard in engine.shards { #expect(try await shard.clientExists(cid, on: h.loop).get()) }
            _ = try await h.subscribe(cid, "/jobs/*")
            _ = try await h.subscribe(cid, "/**")
            try await h.settle()
            let home = engine.map.shard(ofChannel: "/jobs/1")
            for (k, shard) in engine.shards.enumerated() {
                let held = Set(shard.local.snapshot().first { $0.id == cid }?.subscriptions ?? [])
                let expected: Set<String> = k == 0 || k == home ? ["/jobs/*", "/**"] : ["/**"]
                #expect(held == expected, "shard \(k)")
            }
        }
    }
}
