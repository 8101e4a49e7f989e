import Testing

@testable import PubSubRedis

@Suite struct ShardMapTests {
    @Test func oneShardKeepsTheKeysOfAnEngineWithoutShards() throws {
        let map = try ShardMap(prefix: "pubsub:", count: 1)
        #expect(map.prefixes == ["{pubsub:}"])
        #expect(map.shard(ofChannel: "/jobs/42") == 0)
        #expect(map.shards(ofSubscription: "/**") == .one(0))
    }

    /// Shard k's slot lies in the k-th of N equal ranges, so an evenly split cluster of N masters gives each
    /// shard its own master; the tags are the same on every node.
    @Test(arguments: [2, 3, 6, 16])
    func eachShardHasASlotInItsOwnRange(_ count: Int) throws {
        let map = try ShardMap(prefix: "pubsub:", count: count)
        #expect(map.prefixes.count == count)
        #expect(Set(map.prefixes).count == count)
        let width = ClusterSlot.count / count
        for (k, prefix) in map.prefixes.enumerated() {
            #expect(ClusterSlot.tag(of: prefix) != nil)
            let slot = ClusterSlot.of(prefix)
            #expect(slot >= k * width && (k == count - 1 || slot < (k + 1) * width))
        }
        #expect(try ShardMap(prefix: "pubsub:", count: count).prefixes == map.prefixes)
    }

    /// Golden values: CLUSTER KEYSLOT of each tag, so that a change of the tag search (which would strand every
    /// key of a running service) fails here.
    @Test func theTagsOfThreeShardsAreFixed() throws {
        let map = try ShardMap(prefix: "pubsub:", count: 3)
        #expect(map.prefixes == ["{pubsub:3}", "{pubsub:6}", "{pubsub:8}"])
        // CLUSTER KEYSLOT {pubsub:3}, {pubsub:6}, {pubsub:8} on Redis 7.
        #expect(map.prefixes.map { ClusterSlot.of($0) } == Self.slots)
    }
    static let slots = [3475, 7478, 15608]

    @Test func aChannelGoesWhereItsFirstSegmentsSay() throws {
        let one = try ShardMap(prefix: "p:", count: 8)
        #expect(one.shard(ofChannel: "/jobs/1") == one.shard(ofChannel: "/jobs/2/x"))
        #expect(one.shard(ofChannel: "/jobs") == one.shard(ofChannel: "/jobs/2"))
        #expect(one.shards(ofSubscription: "/jobs/*") == .one(one.shard(ofChannel: "/jobs/1")))
        #expect(one.shards(ofSubscription: "/jobs/**") == .one(one.shard(ofChannel: "/jobs/1")))
        #expect(one.shards(ofSubscription: "/*") == .all)
        #expect(one.shards(ofSubscription: "/**") == .all)
        let spread = Set((0..<200).map { one.shard(ofChannel: "/c\($0)/x") })
        #expect(spread.count == 8)

        let two = try ShardMap(prefix: "p:", count: 8, segments: 2)
        #expect(two.shard(ofChannel: "/rooms/7/a") == two.shard(ofChannel: "/rooms/7"))
        #expect(Set((0..<200).map { two.shard(ofChannel: "/rooms/\($0)") }).count == 8)
        #expect(two.shards(ofSubscription: "/rooms/*") == .all)
        #expect(two.shards(ofSubscription: "/rooms/7/*") == .one(two.shard(ofChannel: "/rooms/7")))
        #expect(two.shards(ofSubscription: "/rooms") == .one(two.shard(ofChannel: "/rooms")))
    }

    @Test func aVectorTokenGivesEachShardItsPart() throws {
        let map = try ShardMap(prefix: "p:", count: 3)
        let vector = map.vector(["2.a.b", "2.c.d", "2.e.f"])
        #expect(vector == "2.a.b~2.c.d~2.e.f")
        #expect(map.component(of: vector, shard: 1) == "2.c.d")
        #expect(map.component(of: "2.c.d", shard: 2) == "2.c.d")
        #expect(map.component(of: "2.a.b~2.c.d", shard: 0) == "")
    }

    @Test func badSettingsAreRefusedWithAReason() {
        #expect(throws: ShardMap.Error.self) { try ShardMap(prefix: "p:", count: 0) }
        #expect(throws: ShardMap.Error.self) { try ShardMap(prefix: "p:", count: 65) }
        #expect(throws: ShardMap.Error.self) { try ShardMap(prefix: "p:", count: 2, segments: 0) }
        #expect(throws: ShardMap.Error.self) { try ShardMap(prefix: "{app}p:", count: 2) }
    }
}
