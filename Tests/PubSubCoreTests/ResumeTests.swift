import Bayeux
import NIOCore
import PropertyBased
import PubSubTesting
import Testing

@testable import PubSubCore

/// A client of the harness that remembers the last position it saw.
struct ResumingClient {
    var clientId: String
    var lastPosition: String

    static func start(_ h: Harness, channel: String, resume: String? = nil) -> (ResumingClient, JSONObject) {
        let handshake = h.reply(
            #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)
        let clientId = handshake["clientId"]!.stringValue!
        var client = ResumingClient(
            clientId: clientId, lastPosition: handshake["ext"]!.objectValue!["position"]!.stringValue!)
        _ = h.connect(clientId)
        let resumeExt = resume.map { #","ext":{"resume":"\#($0)"}"# } ?? ""
        let reply = h.reply(
            #"{"channel":"/meta/subscribe","clientId":"\#(clientId)","subscription":"\#(channel)"\#(resumeExt)}"#)
        // A recovered client goes on from its own token; one that was not starts over from "now".
        if let resume, reply["ext"]?.objectValue?["resume"]?.objectValue?["recovered"] == true {
            client.lastPosition = resume
        }
        return (client, reply)
    }

    /// Connects and returns the `data` of every event received, remembering the last position.
    mutating func receive(_ h: Harness) -> [JSONValue] {
        guard case .connect(let c) = h.connect(clientId) else { return [] }
        let events = c.result.events.map { try! JSONParser().parse($0.json).arrayValue![0].objectValue! }
        if let last = events.last { lastPosition = last["ext"]!.objectValue!["position"]!.stringValue! }
        return events.map { $0["data"]! }
    }
}

@Suite struct ResumeTests {
    @Test func handshakeAndEventsCarryOpaquePositionsOfIncreasingSequences() {
        let h = Harness()
        let engine = h.broker.engine as! MemoryEngine
        var (client, _) = ResumingClient.start(h, channel: "/a")
        _ = h.publish("/a", "1")
        _ = h.publish("/a", "2")
        guard case .connect(let c) = h.connect(client.clientId) else {
            Issue.record("no connect")
            return
        }
        let positions = c.result.events.map {
            try! JSONParser().parse($0.json).arrayValue![0].objectValue!["ext"]!.objectValue!["position"]!.stringValue!
        }
        #expect(positions.count == 2)
        #expect(Set(positions + [client.lastPosition]).count == 3)
        #expect(positions.allSatisfy { $0.hasPrefix("2.") && Position.parse($0) != nil })
        // Inside, they are the sequences 0 (the handshake's), 1 and 2; on the wire, nothing says so.
        let sequences = ([client.lastPosition] + positions).map {
            Position(token: $0, key: engine.positionKey)!.sequence
        }
        #expect(sequences == [0, 1, 2])
        client.lastPosition = positions[1]
    }

    @Test func theHandshakePositionDoesNotCountOtherChannelsTraffic() {
        // Two brokers with the same epoch and key: one saw no publish, the other 1000 on a channel nobody reads.
        let key = PositionKey(text: "00112233445566778899aabbccddeeff")!
        let quiet = Harness(engine: MemoryEngine(configuration: .init(), epoch: 7, positionKey: key))
        let busy = Harness(engine: MemoryEngine(configuration: .init(), epoch: 7, positionKey: key))
        for _ in 1...1000 { _ = busy.publish("/secret") }
        let a = try! #require(Position.parse(quiet.broker.engine.position!)).permuted
        let b = try! #require(Position.parse(busy.broker.engine.position!)).permuted
        #expect(a != b)
        // The plain format would have said 0 and 1000 (`1.7.0`, `1.7.rs`); these are 64-bit pseudo-random values.
        #expect(a > 1 << 32 || b > 1 << 32)
        #expect(Position(token: busy.broker.engine.position!, key: key)?.sequence == 1000)
    }

    @Test func resumeDeliversExactlyTheMissedMatchingMessagesThenLiveOnes() {
        for pattern in ["/room/a", "/room/*"] {
            let h = Harness()
            var (client, _) = ResumingClient.start(h, channel: pattern)
            _ = h.publish("/room/a", "1")
            #expect(client.receive(h) == [1])
            let token = client.lastPosition
            _ = h.reply(#"{"channel":"/meta/disconnect","clientId":"\#(client.clientId)"}"#)
            _ = h.publish("/room/a", "2")
            _ = h.publish("/other", "99")
            _ = h.publish("/room/a/deeper", "98")
            _ = h.publish("/room/a", "3")
            var (again, reply) = ResumingClient.start(h, channel: pattern, resume: token)
            #expect(reply["successful"] == true)
            #expect(reply["ext"] == json(#"{"resume":{"recovered":true,"missed":2}}"#))
            _ = h.publish("/room/a", "4")
            #expect(again.receive(h) == [2, 3, 4], "\(pattern)")
        }
    }

    @Test func wildcardResumeCoversEveryMatchingChannel() {
        let h = Harness()
        let (client, _) = ResumingClient.start(h, channel: "/room/**")
        let token = client.lastPosition
        _ = h.publish("/room/a", "1")
        _ = h.publish("/room/b/c", "2")
        _ = h.publish("/elsewhere", "3")
        var (again, reply) = ResumingClient.start(h, channel: "/room/**", resume: token)
        #expect(reply["ext"] == json(#"{"resume":{"recovered":true,"missed":2}}"#))
        #expect(again.receive(h) == [1, 2])
    }

    @Test func tokenOlderThanTheHistoryIsNotRecovered() {
        let h = Harness(configuration: BrokerConfiguration(historySize: 3))
        let (client, _) = ResumingClient.start(h, channel: "/a")
        let token = client.lastPosition
        for i in 1...5 { _ = h.publish("/a", "\(i)") }
        let (_, reply) = ResumingClient.start(h, channel: "/a", resume: token)
        #expect(reply["successful"] == true)
        #expect(reply["ext"] == json(#"{"resume":{"recovered":false,"missed":3}}"#))
    }

    @Test(arguments: [
        "garbage", "", "1.zz.1", "2.1.1", "1.1.1.1", "1.-1.2", "1.\(String(repeating: "z", count: 40)).1", "2.1.-1",
        "2..1", "2.1.", "2.A.1", "2.1.+1", "2.1.\(String(repeating: "z", count: 14))", "2.1.1.1", "3.1.1",
    ])
    func garbageTokensAreAnsweredNotRefused(_ token: String) {
        let h = Harness()
        let (_, reply) = ResumingClient.start(h, channel: "/a", resume: token)
        #expect(reply["successful"] == true)
        #expect(reply["ext"] == json(#"{"resume":{"recovered":false,"missed":0}}"#))
    }

    @Test func aTokenOfTheFirstFormatIsForeign() {
        // `1.<epoch>.<sequence>` was the plain format: a client that forges one from this epoch gets nothing.
        let engine = MemoryEngine(configuration: .init(), epoch: 12345)
        let h = Harness(engine: engine)
        let (_, _) = ResumingClient.start(h, channel: "/a")
        _ = h.publish("/a")
        let plain = "1." + String(UInt64(12345), radix: 36) + ".0"
        let (_, reply) = ResumingClient.start(h, channel: "/a", resume: plain)
        #expect(reply["ext"] == json(#"{"resume":{"recovered":false,"missed":0}}"#))
        // A well-formed token of the right epoch that this broker never issued is not recovered either.
        let forged = "2." + String(UInt64(12345), radix: 36) + ".1"
        let (_, again) = ResumingClient.start(h, channel: "/a", resume: forged)
        #expect(again["ext"]?.objectValue?["resume"]?.objectValue?["recovered"] == false)
    }

    @Test func aNewEpochInvalidatesOldTokens() {
        let before = Harness()
        let (client, _) = ResumingClient.start(before, channel: "/a")
        _ = before.publish("/a")
        let after = Harness()  // a restarted broker: a new memory engine, a new epoch
        let (_, reply) = ResumingClient.start(after, channel: "/a", resume: client.lastPosition)
        #expect(reply["ext"] == json(#"{"resume":{"recovered":false,"missed":0}}"#))
    }

    @Test func historyTTLDropsOldEvents() {
        var h = Harness(configuration: BrokerConfiguration(historyTTL: .seconds(10)))
        let (client, _) = ResumingClient.start(h, channel: "/a")
        _ = h.publish("/a", "1")
        h.now = h.now + .seconds(11)
        let (_, reply) = ResumingClient.start(h, channel: "/a", resume: client.lastPosition)
        #expect(reply["ext"] == json(#"{"resume":{"recovered":false,"missed":0}}"#))
    }

    @Test func withoutHistoryThereAreNoPositions() {
        let h = Harness(configuration: BrokerConfiguration(historySize: 0))
        let handshake = h.reply(
            #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)
        #expect(handshake["ext"] == nil)
    }

    @Test func aResumeThatWouldOverflowTheQueueIsNotRecovered() {
        let h = Harness(configuration: BrokerConfiguration(maxQueue: 2))
        let (client, _) = ResumingClient.start(h, channel: "/a")
        for _ in 1...3 { _ = h.publish("/a") }
        let (_, reply) = ResumingClient.start(h, channel: "/a", resume: client.lastPosition)
        #expect(reply["ext"] == json(#"{"resume":{"recovered":false,"missed":3}}"#))
    }

    /// Random schedules of publishes, drains, disconnects and resumes: a client either gets every matching
    /// message exactly once and in order, or is told `recovered: false` (and then starts over from "now").
    @Test func resumeIsExactOrHonest() async {
        await Self.checkExactOrHonest(BrokerConfiguration(historySize: 6), padding: { _ in 0 })
    }

    /// The same with the history bounded by bytes: events of random sizes, some larger than the bound alone.
    @Test func resumeIsExactOrHonestWhenTheHistoryIsBoundedByBytes() async {
        await Self.checkExactOrHonest(
            BrokerConfiguration(historySize: 1000, historyBytes: 1200), padding: { ($0 * 7919) % 1500 })
    }

    static func checkExactOrHonest(_ configuration: BrokerConfiguration, padding: @escaping @Sendable (Int) -> Int)
        async
    {
        await propertyCheck(count: 300, input: Gen.int(in: 0...5).array(of: 1...60)) { schedule in
            let h = Harness(configuration: configuration)
            var client: ResumingClient? = ResumingClient.start(h, channel: "/a/*").0
            var token = client!.lastPosition
            var expected: [JSONValue] = []
            var received: [JSONValue] = []
            var counter = 0
            for op in schedule {
                switch op {
                case 0, 1:
                    counter += 1
                    let pad = String(repeating: "p", count: padding(counter))
                    _ = h.publish("/a/x", #"{"n":\#(counter),"pad":"\#(pad)"}"#)
                    expected.append(JSONValue(counter))
                case 2:
                    _ = h.publish("/b", "0")
                case 3:
                    if var c = client {
                        received += c.receive(h).map { $0.objectValue!["n"]! }
                        client = c
                        token = c.lastPosition
                    }
                case 4:
                    if let c = client {
                        // Dropped without a word: whatever was queued and not received is lost with the session.
                        _ = h.reply(#"{"channel":"/meta/disconnect","clientId":"\#(c.clientId)"}"#)
                        token = c.lastPosition
                        client = nil
                    }
                default:
                    if client == nil {
                        let (c, reply) = ResumingClient.start(h, channel: "/a/*", resume: token)
                        client = c
                        let recovered = reply["ext"]?.objectValue?["resume"]?.objectValue?["recovered"]
                        if recovered == .bool(false) {
                            // The client knows it must refetch: expectations restart from now.
                            expected = []
                            received = []
                        }
                    }
                }
            }
            if var c = client {
                received += c.receive(h).map { $0.objectValue!["n"]! }
            } else {
                let (c0, reply) = ResumingClient.start(h, channel: "/a/*", resume: token)
                var c = c0
                if reply["ext"]?.objectValue?["resume"]?.objectValue?["recovered"] == .bool(false) {
                    expected = []
                    received = []
                }
                received += c.receive(h).map { $0.objectValue!["n"]! }
            }
            #expect(received == expected)
        }
    }
}
