import Bayeux
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// The engine contract, run against the memory engine and against the Redis engine on a real redis-server.
@Suite(.serialized, .timeLimit(.minutes(2))) struct EngineConformanceTests {
    @Test(arguments: EngineKind.allCases)
    func firstConnectAnsweredAtOnceLaterOnesParkAndPublishReleases(_ kind: EngineKind) async throws {
        try await withCluster(kind, configuration: BrokerConfiguration(historySize: 0)) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            let sink = RecordingSink(loop: h.loop, persistent: false)
            let first = try #require(try await h.connect(cid, sink: sink))
            #expect(first.result.answerNow && !first.result.attached)
            let second = try #require(try await h.connect(cid, sink: sink))
            #expect(!second.result.answerNow && second.result.attached)
            #expect(try await h.subscribe(cid, "/foo/*")["successful"] == true)
            #expect(
                try await h.reply(#"{"channel":"/foo/bar","data":{"hello":"world"},"clientId":"\#(cid)","id":"18"}"#)[
                    "successful"] == true)
            try await h.settle()
            #expect(sink.events == [json(#"{"channel":"/foo/bar","data":{"hello":"world"},"id":"18"}"#)])
        }
    }

    @Test(arguments: EngineKind.allCases)
    func queuedEventsComeWithTheNextConnectInOrderAndAreNotCollapsed(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            _ = try await h.connect(cid)
            _ = try await h.subscribe(cid, "/q")
            for i in [1, 2, 2, 3] { _ = try await h.publish("/q", "\(i)") }
            try await h.settle()
            #expect(try await h.receive(cid) == [1, 2, 2, 3])
        }
    }

    @Test(arguments: EngineKind.allCases)
    func wildcardRoutingDeliversOncePerEvent(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            _ = try await h.connect(cid)
            let reply = try await h.reply(
                #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":["/a/b","/a/*","/x/**","/**"]}"#)
            #expect(reply["successful"] == true)
            _ = try await h.publish("/a/zz", #""a""#)
            _ = try await h.publish("/x/y/z", #""x""#)
            _ = try await h.publish("/a/b", #""once""#)
            try await h.settle()
            let got = try await h.receive(cid)
            if kind == .redisShards {
                // /a and /x are in different shards: order is kept per shard only.
                #expect(got.count == 3 && Set(got.compactMap(\.stringValue)) == ["a", "x", "once"])
                #expect(got.filter { $0 != "x" } == ["a", "once"])
            } else {
                #expect(got == ["a", "x", "once"])
            }
        }
    }

    @Test(arguments: EngineKind.allCases)
    func unsubscribeLimitsAndUnknownClients(_ kind: EngineKind) async throws {
        try await withCluster(kind, configuration: BrokerConfiguration(maxSubscriptionsPerClient: 2)) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            #expect(try await h.subscribe(cid, "/a")["successful"] == true)
            #expect(try await h.subscribe(cid, "/a")["successful"] == true)
            #expect(try await h.subscribe(cid, "/b")["successful"] == true)
            #expect(try await h.subscribe(cid, "/c")["error"] == "403:/c:Subscription limit reached")
            #expect(
                try await h.reply(#"{"channel":"/meta/unsubscribe","clientId":"\#(cid)","subscription":"/a"}"#)[
                    "successful"] == true)
            #expect(try await h.subscribe(cid, "/c")["successful"] == true)
            _ = try await h.publish("/a", "1")
            _ = try await h.publish("/c", "2")
            try await h.settle()
            #expect(try await h.receive(cid) == [2])
            #expect(try await h.subscribe("nope", "/a")["error"] == "401:nope:Unknown client")
            #expect(try await h.connectReply("nope")["error"] == "401:nope:Unknown client")
        }
    }

    @Test(arguments: EngineKind.allCases)
    func sessionsExpireAfterTwiceTheTimeoutWithoutConnect(_ kind: EngineKind) async throws {
        try await withCluster(kind, configuration: BrokerConfiguration(timeout: .seconds(5))) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            let parked = try await h.handshake()
            _ = try await h.connect(parked)
            let sink = RecordingSink(loop: h.loop, persistent: false)
            _ = try await h.connect(parked, sink: sink)
            try await h.sweep(at: h.now + .seconds(9))
            #expect(try await h.subscribe(cid, "/a")["successful"] == true)
            h.now = h.now + .seconds(9)
            _ = try await h.connect(cid)
            try await h.sweep(at: h.now + .seconds(9))
            #expect(try await h.subscribe(cid, "/a")["successful"] == true)
            try await h.sweep(at: h.now + .seconds(10))
            try await h.settle()
            let reply = try await h.connectReply(cid)
            #expect(reply["error"] == .string("401:\(cid):Unknown client"))
            #expect(reply["advice"] == json(#"{"reconnect":"handshake"}"#))
            #expect(sink.detaches == [.expired])
        }
    }

    @Test(arguments: EngineKind.allCases)
    func disconnectReleasesTheParkedConnect(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            _ = try await h.connect(cid)
            let sink = RecordingSink(loop: h.loop, persistent: false)
            _ = try await h.connect(cid, sink: sink)
            #expect(try await h.reply(#"{"channel":"/meta/disconnect","clientId":"\#(cid)"}"#)["successful"] == true)
            try await h.settle()
            #expect(sink.detaches == [.disconnected])
            #expect(
                try await h.reply(#"{"channel":"/meta/disconnect","clientId":"\#(cid)"}"#)["error"]
                    == .string("401:\(cid):Unknown client"))
        }
    }

    @Test(arguments: EngineKind.allCases)
    func overflowDropsOnlyTheSlowClientAndSaysSo(_ kind: EngineKind) async throws {
        try await withCluster(kind, configuration: BrokerConfiguration(maxQueue: 3)) { cluster in
            let h = cluster.first
            let slow = try await h.handshake()
            let fast = try await h.handshake()
            _ = try await h.connect(slow)
            _ = try await h.subscribe(slow, "/q")
            _ = try await h.subscribe(fast, "/q")
            let ws = RecordingSink(loop: h.loop, persistent: true)
            _ = try await h.connect(fast, sink: ws, type: "websocket")
            for _ in 0..<4 { _ = try await h.publish("/q") }
            try await h.settle()
            try await h.settle()
            #expect(ws.events.count == 4)
            let reply = try await h.connectReply(slow)
            #expect(reply["error"] == .string("409:\(slow):Queue overflow"))
            #expect(reply["advice"] == json(#"{"reconnect":"handshake"}"#))
        }
    }

    @Test(arguments: EngineKind.allCases)
    func resumeDeliversExactlyTheMissedMatchingEventsThenLiveOnes(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            _ = try await h.connect(cid)
            _ = try await h.subscribe(cid, "/room/*")
            _ = try await h.publish("/room/a", "1")
            try await h.settle()
            guard let c = try await h.connect(cid), let last = c.result.events.last else {
                Issue.record("no event")
                return
            }
            let token = try JSONParser().parse(last.json).arrayValue![0].objectValue!["ext"]!.objectValue!["position"]!
                .stringValue!
            _ = try await h.reply(#"{"channel":"/meta/disconnect","clientId":"\#(cid)"}"#)
            _ = try await h.publish("/room/a", "2")
            _ = try await h.publish("/other", "99")
            _ = try await h.publish("/room/a/deeper", "98")
            _ = try await h.publish("/room/b", "3")
            let again = try await h.handshake()
            _ = try await h.connect(again)
            let reply = try await h.subscribe(again, "/room/*", ext: #"{"resume":"\#(token)"}"#)
            #expect(reply["ext"] == json(#"{"resume":{"recovered":true,"missed":2}}"#))
            _ = try await h.publish("/room/a", "4")
            try await h.settle()
            #expect(try await h.receive(again) == [2, 3, 4])
            for garbage in ["garbage", "1.zz.1", "2.1.1"] {
                let other = try await h.handshake()
                let r = try await h.subscribe(other, "/room/*", ext: #"{"resume":"\#(garbage)"}"#)
                #expect(r["ext"] == json(#"{"resume":{"recovered":false,"missed":0}}"#))
            }
        }
    }

    @Test(arguments: EngineKind.allCases)
    func aTokenOlderThanTheHistoryIsNotRecovered(_ kind: EngineKind) async throws {
        try await withCluster(kind, configuration: BrokerConfiguration(historySize: 3)) { cluster in
            let h = cluster.first
            let handshake = try await h.reply(
                #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)
            let token = try #require(handshake["ext"]?.objectValue?["position"]?.stringValue)
            for i in 1...5 { _ = try await h.publish("/a", "\(i)") }
            let cid = try await h.handshake()
            let reply = try await h.subscribe(cid, "/a", ext: #"{"resume":"\#(token)"}"#)
            #expect(reply["ext"] == json(#"{"resume":{"recovered":false,"missed":3}}"#))
        }
    }

    /// The handshake's position is made on the node (Swift), an event's in the engine (Lua for Redis): the same
    /// sequence must give the same token, and a resume from it must be exact.
    @Test(arguments: EngineKind.allCases)
    func theHandshakePositionIsTheLastEventsPosition(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            _ = try await h.connect(cid)
            _ = try await h.subscribe(cid, "/p")
            for i in 1...3 { _ = try await h.publish("/p", "\(i)") }
            try await h.settle()
            let events = try #require(try await h.connect(cid)).result.events.map {
                try JSONParser().parse($0.json).arrayValue![0].objectValue!["ext"]!.objectValue!["position"]!
                    .stringValue!
            }
            #expect(events.count == 3)
            #expect(events.allSatisfy { $0.hasPrefix("2.") })
            let handshake = try await h.reply(
                #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)
            let position = handshake["ext"]?.objectValue?["position"]?.stringValue
            if let map = h.sharded?.map {
                // One part per shard; /p's shard's part is its last event's position.
                #expect(position.map { map.component(of: $0, shard: map.shard(ofChannel: "/p")) } == events.last)
            } else {
                #expect(position == events.last)
            }
            let other = try await h.handshake()
            _ = try await h.connect(other)
            let reply = try await h.subscribe(other, "/p", ext: #"{"resume":"\#(events[0])"}"#)
            #expect(reply["ext"] == json(#"{"resume":{"recovered":true,"missed":2}}"#))
            try await h.settle()
            #expect(try await h.receive(other) == [2, 3])
        }
    }

    /// Events of about 1 KB against a 3,500-byte bound: three are held, whatever the count bound says.
    @Test(arguments: EngineKind.allCases)
    func theHistoryIsBoundedByBytesAsWellAsByCount(_ kind: EngineKind) async throws {
        try await withCluster(kind, configuration: BrokerConfiguration(historySize: 1000, historyBytes: 3500)) {
            cluster in
            let h = cluster.first
            let pad = String(repeating: "x", count: 1000)
            let handshake = try await h.reply(
                #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)
            let start = try #require(handshake["ext"]?.objectValue?["position"]?.stringValue)
            let cid = try await h.handshake()
            _ = try await h.connect(cid)
            _ = try await h.subscribe(cid, "/a")
            for i in 1...5 { _ = try await h.publish("/a", #"{"n":\#(i),"pad":"\#(pad)"}"#) }
            try await h.settle()
            let events = try #require(try await h.connect(cid)).result.events.map {
                try JSONParser().parse($0.json).arrayValue![0].objectValue!
            }
            #expect(events.map { $0["data"]?.objectValue?["n"] } == (1...5).map { JSONValue($0) })
            let positions = events.map { $0["ext"]!.objectValue!["position"]!.stringValue! }
            func resume(_ token: String) async throws -> (JSONValue?, [JSONValue]) {
                let c = try await h.handshake()
                _ = try await h.connect(c)
                let reply = try await h.subscribe(c, "/a", ext: #"{"resume":"\#(token)"}"#)
                try await h.settle()
                let got = try await h.receive(c).map { $0.objectValue?["n"] ?? .null }
                return (reply["ext"], got)
            }
            // From before the first: events 1 and 2 were pushed out by bytes (the count bound is 1000).
            #expect(try await resume(start).0 == json(#"{"resume":{"recovered":false,"missed":3}}"#))
            var (ext, got) = try await resume(positions[1])
            #expect(ext == json(#"{"resume":{"recovered":true,"missed":3}}"#))
            #expect(got == [3, 4, 5])
            // An event larger than the bound on its own is delivered, not kept, and takes everything with it.
            let huge = String(repeating: "y", count: 4000)
            _ = try await h.publish("/a", #"{"n":6,"pad":"\#(huge)"}"#)
            try await h.settle()
            let sixth = try #require(try await h.connect(cid)).result.events.map {
                try JSONParser().parse($0.json).arrayValue![0].objectValue!
            }
            #expect(sixth.map { $0["data"]?.objectValue?["n"] } == [6])
            #expect(try await resume(positions[4]).0 == json(#"{"resume":{"recovered":false,"missed":0}}"#))
            // What comes after it is kept again: a resume from the huge event's position is exact.
            let hugePosition = try #require(sixth.first?["ext"]?.objectValue?["position"]?.stringValue)
            _ = try await h.publish("/a", #"{"n":7}"#)
            (ext, got) = try await resume(hugePosition)
            #expect(ext == json(#"{"resume":{"recovered":true,"missed":1}}"#))
            #expect(got == [7])
            if let redis = h.redis {
                // The byte total kept in Redis is the sum of what its history list holds.
                let list = try await redis.commands.send(
                    RESPCommand("LRANGE", .string(redis.keyPrefix + "history"), "0", "-1")
                ).get()
                let total = try await redis.commands.send(RESPCommand("GET", .string(redis.keyPrefix + "hbytes"))).get()
                let sum = (list.array ?? []).reduce(0) { $0 + ($1.buffer?.readableBytes ?? 0) }
                #expect(list.array?.count == 1)
                #expect(total.string.flatMap { Int($0) } == sum)
            }
        }
    }

    @Test(arguments: EngineKind.allCases)
    func persistentSinkGetsEveryEventInOrder(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            let ws = RecordingSink(loop: h.loop, persistent: true)
            _ = try await h.connect(cid, sink: ws, type: "websocket")
            _ = try await h.subscribe(cid, "/q")
            for i in 1...25 { _ = try await h.publish("/q", "\(i)") }
            try await h.settle()
            try await h.settle()
            // A WebSocket sends `/meta/connect` again every timeout with the same sink: it stays attached, and
            // is not told it was superseded.
            let again = try #require(try await h.connect(cid, sink: ws, type: "websocket"))
            #expect(again.result.attached && again.result.events.isEmpty)
            for i in 26...50 { _ = try await h.publish("/q", "\(i)") }
            try await h.settle()
            try await h.settle()
            #expect(ws.detaches.isEmpty)
            #expect(ws.data == (1...50).map { JSONValue($0) })
        }
    }
}
