import NIOCore
import Testing

@testable import PubSubRedis

/// Slots, the slot map, and the decisions of finding and following the engine's slot, without sockets.
@Suite struct ClusterStateMachineTests {
    let n1 = RedisEndpoint(host: "10.0.0.1", port: 7000)
    let n2 = RedisEndpoint(host: "10.0.0.2", port: 7000)
    let n3 = RedisEndpoint(host: "10.0.0.3", port: 7000)
    let r1 = RedisEndpoint(host: "10.0.0.4", port: 7000)

    /// Golden values from `CLUSTER KEYSLOT` of redis-server 7.0 and the cluster specification.
    @Test func slotsAreThoseRedisComputes() {
        #expect(ClusterSlot.crc16(Array("123456789".utf8)[...]) == 0x31C3)
        #expect(ClusterSlot.of("foo") == 12182)
        #expect(ClusterSlot.of("pubsub:") == 4003)
        #expect(ClusterSlot.of("{pubsub:}c:1") == 4003)
        #expect(ClusterSlot.of("{pubsub:}0:n:node") == 4003)
        #expect(ClusterSlot.of("") == 0)
        // The tag: between the first `{` and the first `}` after it, when not empty.
        #expect(ClusterSlot.of("{user1000}.following") == ClusterSlot.of("user1000"))
        #expect(ClusterSlot.of("foo{}{bar}") == ClusterSlot.of("foo{}{bar}"))
        #expect(ClusterSlot.tag(of: "foo{}{bar}") == nil)
        #expect(ClusterSlot.tag(of: "foo{{bar}}zap") == "{bar")
        #expect(ClusterSlot.tag(of: "foo{bar}{zap}") == "bar")
        #expect(ClusterSlot.tag(of: "plain") == nil)
        #expect(RedisClusterConfiguration.taggedPrefix("pubsub:") == "{pubsub:}")
        #expect(RedisClusterConfiguration.taggedPrefix("app:{ps}:") == "app:{ps}:")
        #expect(RedisClusterConfiguration.taggedPrefix("odd{}:") == "{odd{}:}")
    }

    @Test func readsTheNodeList() throws {
        let plain = try RedisClusterConfiguration.parse("127.0.0.1:7000, 127.0.0.2 ,[::1]:7001")
        #expect(
            plain.seeds == [
                RedisEndpoint(host: "127.0.0.1", port: 7000), RedisEndpoint(host: "127.0.0.2", port: 6379),
                RedisEndpoint(host: "::1", port: 7001),
            ])
        #expect(!plain.connection.tls && plain.connection.password == nil)
        let secure = try RedisClusterConfiguration.parse("rediss://:pw@a:7000,rediss://:pw@b:7000")
        #expect(secure.connection.tls && secure.connection.password == "pw")
        #expect(throws: RedisClusterConfiguration.ParseError.self) {
            try RedisClusterConfiguration.parse("rediss://a,redis://b")
        }
        #expect(throws: RedisClusterConfiguration.ParseError.self) { try RedisClusterConfiguration.parse(" , ") }
        #expect(throws: RedisClusterConfiguration.ParseError.self) { try RedisClusterConfiguration.parse("a:notaport") }
        #expect(throws: RedisClusterConfiguration.ParseError.self) {
            try RedisClusterConfiguration.parse("redis://a:7000/2")
        }
    }

    func bulk(_ s: String) -> RESPValue { .bulkString(ByteBuffer(string: s)) }

    func node(_ host: String, _ port: Int) -> RESPValue {
        .array([bulk(host), .integer(Int64(port)), bulk("0123456789abcdef")])
    }

    @Test func parsesClusterSlots() throws {
        let reply = RESPValue.array([
            .array([.integer(0), .integer(5460), node("10.0.0.1", 7000), node("10.0.0.4", 7000)]),
            .array([.integer(5461), .integer(10922), node("", 7001)]),
            .array([.integer(10923), .integer(16383), node("?", 7002)]),
        ])
        let map = try #require(ClusterSlotMap.parse(reply, askedHost: "10.9.9.9"))
        #expect(map.master(of: 0) == n1 && map.master(of: 5460) == n1)
        #expect(map.master(of: 5461) == RedisEndpoint(host: "10.9.9.9", port: 7001))
        #expect(map.master(of: 16383) == RedisEndpoint(host: "10.9.9.9", port: 7002))
        #expect(map.nodes.count == 4 && map.nodes.last == r1)
        #expect(
            ClusterSlotMap.parse(.array([.array([.integer(0), .integer(16384), node("a", 1)])]), askedHost: "x") == nil)
        #expect(
            ClusterSlotMap.parse(.array([.array([.integer(9), .integer(1), node("a", 1)])]), askedHost: "x") == nil)
        #expect(
            ClusterSlotMap.parse(.array([.array([.integer(0), .integer(1), node("a", 0)])]), askedHost: "x") == nil)
        #expect(ClusterSlotMap.parse(.integer(1), askedHost: "x") == nil)
        // A partial map: the slot is in no range.
        let partial = try #require(
            ClusterSlotMap.parse(.array([.array([.integer(0), .integer(10), node("a", 1)])]), askedHost: "x"))
        #expect(partial.master(of: 11) == nil)
    }

    @Test func parsesRedirections() {
        #expect(
            ClusterStateMachine.parseRedirect("MOVED 4003 127.0.0.1:7101")! == (
                4003, RedisEndpoint(host: "127.0.0.1", port: 7101)
            ))
        #expect(ClusterStateMachine.parseRedirect("ASK 1 [::1]:7000")! == (1, RedisEndpoint(host: "::1", port: 7000)))
        #expect(ClusterStateMachine.parseRedirect("MOVED 16384 a:1") == nil)
        #expect(ClusterStateMachine.parseRedirect("MOVED 1 a:0") == nil)
        #expect(ClusterStateMachine.parseRedirect("MOVED 1 :7000") == nil)
        #expect(ClusterStateMachine.parseRedirect("READONLY You can't write against a read only replica.") == nil)
    }

    func map(_ owner: RedisEndpoint, also others: [RedisEndpoint] = []) -> ClusterSlotMap {
        ClusterSlotMap(ranges: [.init(first: 0, last: 16383, master: owner, replicas: others)])
    }

    /// Each node in turn until one names the slot's master; the nodes a map names are asked too afterwards.
    @Test func discoveryAsksTheNodesInTurnAndLearnsNewOnes() {
        var m = ClusterStateMachine(seeds: [n1, n2], slot: 4003)
        #expect(m.discover() == .ask(server: 0, n1))
        #expect(m.nodeAnswered(0, .failed("connection refused")) == .ask(server: 1, n2))
        #expect(m.nodeAnswered(1, .slots(map(n3, also: [r1]))) == .connect(n3))
        #expect(m.known == [n1, n2, n3, r1])
        #expect(m.verified(n3, role: "master", serves: true) == .use(switched: false))
        #expect(m.master == n3)
        // The next round starts with the node that answered last.
        #expect(m.discover() == .ask(server: 1, n2))
        // A map without the slot (a cluster being set up), then nobody answers at all.
        #expect(m.nodeAnswered(1, .slots(ClusterSlotMap(ranges: []))) == .ask(server: 2, n3))
        #expect(m.nodeAnswered(2, .failed("timeout")) == .ask(server: 3, r1))
        #expect(m.nodeAnswered(3, .failed("timeout")) == .ask(server: 0, n1))
        guard case .fail(let reason) = m.nodeAnswered(0, .failed("timeout")) else {
            Issue.record("a round without an answer must fail")
            return
        }
        #expect(reason.contains("slot 4003") && reason.contains("not served") && reason.contains("timeout"))
    }

    /// A node that is not the slot's master is refused; one that said `MOVED` is followed at once.
    @Test func verificationRefusesWhatDoesNotServeTheSlot() {
        var m = ClusterStateMachine(seeds: [n1], slot: 7)
        #expect(m.verified(n1, role: "slave", serves: false) == .reject)
        #expect(m.verified(n1, role: "master", serves: false, movedTo: n2) == .reject)
        #expect(m.discover() == .connect(n2))
        #expect(m.verified(n2, role: "master", serves: true) == .use(switched: false))
        #expect(m.verified(n3, role: "master", serves: true) == .use(switched: true))
        #expect(m.switches == 1)
        #expect(m.verified(n3, role: nil, serves: true) == .reject)
    }

    /// Through `MasterDiscovery`, as `MasterMonitor` drives it: the check's `MOVED` is followed first.
    @Test func theCheckThroughMasterDiscovery() {
        var m = ClusterStateMachine(seeds: [n1], slot: 7)
        #expect(m.discover() == .ask(server: 0, n1))
        #expect(m.answered(0, .slots(map(n1))) == .connect(n1))
        #expect(m.checked(n1, .init(role: "master", serves: false, movedTo: n2)) == .reject)
        #expect(m.discover() == .connect(n2))
        #expect(m.checked(n2, .init(role: "master", serves: true)) == .use(switched: false))
    }

    /// `MOVED` for the engine's slot, `READONLY` and a server-side `sunsubscribe` ask for rediscovery; a `MOVED`
    /// of another slot does not.
    @Test func signals() {
        var m = ClusterStateMachine(seeds: [n1, n2], slot: 100)
        #expect(m.signal(.moved(slot: 101, to: n2)) == .ignore)
        #expect(m.signal(.moved(slot: 100, to: n2)) == .rediscover)
        #expect(m.discover() == .connect(n2))
        #expect(m.signal(.readOnly) == .rediscover)
        #expect(m.signal(.unsubscribed) == .rediscover)
        #expect(m.discover() == .ask(server: 0, n1))
    }

    /// The Cluster variant of every script sends its notifications with SPUBLISH, and only that differs.
    @Test func shardedScriptsPublishToTheShard() {
        for script in RedisScripts.all + [RedisEngine.reseatScript, RedisPresenceScripts.channels] {
            #expect(!script.sharded.source.contains("redis.call('PUBLISH'"))
            #expect(
                script.sharded.source.replacing("redis.call('SPUBLISH'", with: "redis.call('PUBLISH'")
                    == script.plain.source)
            #expect(script.sharded.sha != script.plain.sha || !script.plain.source.contains("PUBLISH'"))
        }
        #expect(RedisScripts.publish.sharded.source.contains("redis.call('SPUBLISH'"))
    }
}

/// Which refused scripts are sent again, and when.
@Suite struct ClusterRetryTests {
    @Test func slotInMotionIsRetriedWithGrowingDelaysThenGivenUp() {
        let ask = RedisError(.server, "ASK 4003 127.0.0.1:7102")
        #expect(ClusterStateMachine.retryDelay(after: ask, attempt: 0) == .milliseconds(10))
        #expect(ClusterStateMachine.retryDelay(after: ask, attempt: 3) == .milliseconds(80))
        #expect(ClusterStateMachine.retryDelay(after: ask, attempt: 9) == .milliseconds(500))
        #expect(ClusterStateMachine.retryDelay(after: ask, attempt: 10) == nil)
        for message in [
            "TRYAGAIN Multiple keys request during rehashing of slot", "MOVED 1 a:1", "CLUSTERDOWN The cluster is down",
        ] {
            #expect(
                ClusterStateMachine.retryDelay(after: RedisError(.server, message), attempt: 0) != nil, "\(message)")
        }
        // Errors of the script itself, or a lost connection (the script may have run): not again.
        #expect(ClusterStateMachine.retryDelay(after: RedisError(.server, "ERR user_script:1: bad"), attempt: 0) == nil)
        #expect(ClusterStateMachine.retryDelay(after: RedisError(.connectionClosed), attempt: 0) == nil)
        #expect(ClusterStateMachine.retryDelay(after: RedisError(.timeout), attempt: 1) == nil)
        // Not connected: only while following a redirection (the connection is being made again).
        #expect(ClusterStateMachine.retryDelay(after: RedisError(.notConnected), attempt: 0) == nil)
        #expect(ClusterStateMachine.retryDelay(after: RedisError(.notConnected), attempt: 2) == .milliseconds(40))
    }
}
