/// Where each channel lives when one service is spread over several shards of a Redis Cluster
/// (`--redis-shards`): every shard is a whole Redis engine under a hash tag of its own (its own slot, so its own
/// master), with its own positions, history and routing. A publish runs in the shard of its channel only.
///
/// A channel's shard comes from its first `segments` segments (its *shard key*): `/jobs/42` has the key `/jobs`
/// with one segment and `/jobs/42` with two. A subscription lives in the shard of its key too, when its literal
/// part (before a trailing `*` or `**`) has at least `segments` segments; a shorter pattern (`/*`, `/**`, and with
/// two segments `/jobs/*`) can match channels of every shard and is held by all of them.
///
/// Shard 0 also holds the whole session: its user and grant, every subscription (for the limit, presence and the
/// server API), its webhook events. The other shards hold the session again with the subscriptions of their
/// channels only, so each routes and queues its own events. See docs/CLUSTER.md.
public struct ShardMap: Sendable, Equatable {
    public let count: Int
    public let segments: Int
    /// The key prefix of each shard, a hash tag of its own (`{pubsub:17}`), chosen so that shard k's slot lies in
    /// the k-th of `count` equal ranges of the slots: on a cluster whose masters split the slots evenly (as
    /// `redis-cli --cluster create` does) with as many masters as shards, each shard has a master of its own.
    public let prefixes: [String]

    public struct Error: Swift.Error, CustomStringConvertible, Equatable {
        public let description: String
    }

    public static let maximumShards = 64

    public init(prefix: String, count: Int, segments: Int = 1) throws {
        guard (1...Self.maximumShards).contains(count) else {
            throw Error(description: "the number of shards must be 1 to \(Self.maximumShards), not \(count)")
        }
        guard (1...16).contains(segments) else {
            throw Error(description: "a shard key has 1 to 16 segments, not \(segments)")
        }
        self.count = count
        self.segments = segments
        if count == 1 {
            // One shard keeps the keys of an engine without shards.
            prefixes = [RedisClusterConfiguration.taggedPrefix(prefix)]
            return
        }
        guard ClusterSlot.tag(of: prefix) == nil else {
            throw Error(description: "a key prefix with a hash tag ('\(prefix)') cannot be spread over shards")
        }
        let width = ClusterSlot.count / count
        var prefixes: [String] = []
        var i = 0
        for k in 0..<count {
            let range = (k * width)..<(k == count - 1 ? ClusterSlot.count : (k + 1) * width)
            while !range.contains(ClusterSlot.of(prefix + String(i))) { i += 1 }
            prefixes.append("{" + prefix + String(i) + "}")
            i += 1
        }
        self.prefixes = prefixes
    }

    /// The shard of a channel name (not a pattern): where it is published.
    public func shard(ofChannel channel: String) -> Int {
        guard count > 1 else { return 0 }
        return index(of: key(channel.utf8, segments: segments))
    }

    /// The shards a subscription (a name or a pattern) must be held by: one, or all of them.
    public func shards(ofSubscription subscription: String) -> Shards {
        guard count > 1 else { return .one(0) }
        let bytes = subscription.utf8
        var literal = Substring(subscription).utf8[...]
        if subscription.hasSuffix("/**") {
            literal = bytes.dropLast(3)
        } else if subscription.hasSuffix("/*") {
            literal = bytes.dropLast(2)
        } else {
            return .one(shard(ofChannel: subscription))
        }
        let have = literal.reduce(0) { $0 + ($1 == UInt8(ascii: "/") ? 1 : 0) }
        guard have >= segments else { return .all }
        return .one(index(of: key(literal, segments: segments)))
    }

    public enum Shards: Sendable, Equatable {
        case one(Int)
        case all

        public func contains(_ shard: Int) -> Bool {
            switch self {
            case .one(let k): return k == shard
            case .all: return true
            }
        }
    }

    /// The first `segments` segments of a name (`/a/b/c` with 2: `/a/b`); the whole name when it has fewer.
    func key<C: Collection>(_ name: C, segments: Int) -> C.SubSequence where C.Element == UInt8 {
        var seen = 0
        var i = name.startIndex
        while i != name.endIndex {
            if name[i] == UInt8(ascii: "/") {
                if seen == segments { return name[name.startIndex..<i] }
                seen += 1
            }
            i = name.index(after: i)
        }
        return name[...]
    }

    /// FNV-1a (64 bits) of the key, modulo the shard count: the same on every node and every platform.
    func index<C: Collection>(of key: C) -> Int where C.Element == UInt8 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in key {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        return Int(hash % UInt64(count))
    }

    /// The position token of the whole service: each shard's, in shard order, joined by `~`. A client keeps it
    /// as it keeps any position (the handshake's "from now on").
    public func vector(_ tokens: [String]) -> String {
        tokens.joined(separator: "~")
    }

    /// What shard k is asked to resume from: its part of a vector token, or a token as it is (an event's
    /// position, a part of shard k only if it was published there: any other is answered `recovered: false`).
    public func component(of token: String, shard: Int) -> String {
        guard token.contains("~") else { return token }
        let parts = token.split(separator: "~", omittingEmptySubsequences: false)
        guard parts.count == count else { return "" }
        return String(parts[shard])
    }
}
