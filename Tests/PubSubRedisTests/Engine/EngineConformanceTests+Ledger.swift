import Bayeux
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// What a session's connections were handed and its client did not confirm (`DeliveryLedger`), on every engine:
/// sent again on the next connection, confirmed by the next connect, acknowledged by batch, and a resume's range
/// exactly once.
extension EngineConformanceTests {
    private static func connect(_ cid: String, id: String, ack: Int? = nil, type: String = "long-polling") -> String {
        let ext = ack.map { #","ext":{"ack":\#($0)}"# } ?? ""
        return #"{"channel":"/meta/connect","clientId":"\#(cid)","connectionType":"\#(type)","id":"\#(id)"\#(ext)}"#
    }

    /// A session subscribed to `/r` whose WebSocket was handed events 1, 2 and 3.
    private static func threeEventsOnASocket(_ h: Node) async throws -> (String, RecordingSink) {
        let cid = try await h.handshake()
        _ = try await h.subscribe(cid, "/r")
        let dead = RecordingSink(loop: h.loop, persistent: true)
        _ = try await h.send(connect(cid, id: "1", type: "websocket"), sink: dead, type: .websocket)
        for i in 1...3 { _ = try await h.publish("/r", "\(i)") }
        try await h.settle()
        #expect(dead.data == [1, 2, 3])
        return (cid, dead)
    }

    @Test(arguments: EngineKind.allCases)
    func eventsWrittenIntoADeadConnectionGoOutAgainOnTheNext(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let (cid, dead) = try await Self.threeEventsOnASocket(h)
            // The socket died unread; the same session comes back on another one, repeating its connect.
            _ = h.broker.detach(cid, sink: dead, takeEvents: false)
            let next = RecordingSink(loop: h.loop, persistent: true)
            let again = try #require(
                try await h.send(Self.connect(cid, id: "2", type: "websocket"), sink: next, type: .websocket).first)
            guard case .connect(let c) = again else {
                Issue.record("not a connect: \(again)")
                return
            }
            #expect(
                c.result.events.map { try! JSONParser().parse($0.json).arrayValue![0].objectValue!["data"]! } == [
                    1, 2, 3,
                ])
            // On the same live connection, nothing goes out twice.
            _ = try await h.publish("/r", "4")
            try await h.settle()
            _ = try await h.send(Self.connect(cid, id: "3", type: "websocket"), sink: next, type: .websocket)
            try await h.settle()
            #expect(next.data == [4])
        }
    }

    @Test(arguments: EngineKind.allCases)
    func aConnectSentAgainWithTheSameIdGetsTheLostReplysEventsAgain(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            _ = try await h.subscribe(cid, "/r")
            #expect(try await h.connectWritten(Self.connect(cid, id: "a")).data == [])
            for i in 1...2 { _ = try await h.publish("/r", "\(i)") }
            try await h.settle()
            #expect(try await h.connectWritten(Self.connect(cid, id: "b")).data == [1, 2])
            // The reply to "b" was lost: the client sends "b" again, and gets its events again.
            #expect(try await h.connectWritten(Self.connect(cid, id: "b")).data == [1, 2])
            // "c" proves the reply to "b" was read.
            #expect(try await h.connectWritten(Self.connect(cid, id: "c")).data == [])
            _ = try await h.publish("/r", "3")
            try await h.settle()
            #expect(try await h.connectWritten(Self.connect(cid, id: "d")).data == [3])
            #expect(h.engine.statistics.resent == 2)
        }
    }

    @Test(arguments: EngineKind.allCases)
    func theAcknowledgementExtensionConfirmsByBatch(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let handshake = try await h.reply(
                #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"],"ext":{"ack":true}}"#
            )
            #expect(handshake["ext"]?.objectValue?["ack"] == .bool(true))
            let cid = try #require(handshake["clientId"]?.stringValue)
            _ = try await h.subscribe(cid, "/r")
            let first = try await h.connectWritten(Self.connect(cid, id: "1", ack: 0))
            let b1 = try #require(first.reply["ext"]?.objectValue?["ack"]?.doubleValue)
            for i in 1...2 { _ = try await h.publish("/r", "\(i)") }
            try await h.settle()
            let second = try await h.connectWritten(Self.connect(cid, id: "2", ack: Int(b1)))
            #expect(second.data == [1, 2])
            let b2 = try #require(second.reply["ext"]?.objectValue?["ack"]?.doubleValue)
            #expect(b2 > b1)
            // The reply of batch b2 never arrived: the client acknowledges b1 again, on a new id, and gets 1 and 2.
            let third = try await h.connectWritten(Self.connect(cid, id: "3", ack: Int(b1)))
            #expect(third.data == [1, 2])
            let b3 = try #require(third.reply["ext"]?.objectValue?["ack"]?.doubleValue)
            _ = try await h.publish("/r", "3")
            try await h.settle()
            #expect(try await h.connectWritten(Self.connect(cid, id: "4", ack: Int(b3))).data == [3])
            // A client without the extension gets no ext.ack.
            let plain = try await h.handshake()
            #expect(try await h.connectWritten(Self.connect(plain, id: "1")).reply["ext"] == nil)
        }
    }

    @Test(arguments: EngineKind.allCases)
    func aResumeOnALiveSessionComesOnceBeforeAnythingNewer(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let handshake = try await h.reply(
                #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)
            let cid = try #require(handshake["clientId"]?.stringValue)
            let start = try #require(handshake["ext"]?.objectValue?["position"]?.stringValue)
            _ = try await h.connectWritten(Self.connect(cid, id: "1"))
            _ = try await h.subscribe(cid, "/r")
            for i in 1...3 { _ = try await h.publish("/r", "\(i)") }
            try await h.settle()
            // 1, 2 and 3 wait in the queue; a resume from before them queues them once, not twice.
            let reply = try await h.subscribe(cid, "/r", ext: #"{"resume":"\#(start)"}"#)
            #expect(reply["ext"] == json(#"{"resume":{"recovered":true,"missed":3}}"#))
            try await h.settle()
            _ = try await h.publish("/r", "4")
            try await h.settle()
            #expect(try await h.connectWritten(Self.connect(cid, id: "2")).data == [1, 2, 3, 4])
            // Handed out and unconfirmed, then resumed on a new connection: once, from the range.
            let again = try await h.subscribe(cid, "/r", ext: #"{"resume":"\#(start)"}"#)
            #expect(again["ext"] == json(#"{"resume":{"recovered":true,"missed":4}}"#))
            try await h.settle()
            #expect(try await h.connectWritten(Self.connect(cid, id: "2")).data == [1, 2, 3, 4])
        }
    }

    @Test(arguments: EngineKind.allCases)
    func aResumeFromTheLastPositionSeenGetsNothingTwice(_ kind: EngineKind) async throws {
        try await withCluster(kind) { cluster in
            let h = cluster.first
            let (cid, dead) = try await Self.threeEventsOnASocket(h)
            let positions = dead.events.map { $0.objectValue?["ext"]?.objectValue?["position"]?.stringValue }
            // The client read 1 and 2 before its socket died; it comes back on a new one, on the same session,
            // and resumes from 2: 3 comes once, from the range, and 1 and 2, unconfirmed, do not come again.
            _ = h.broker.detach(cid, sink: dead, takeEvents: false)
            let next = RecordingSink(loop: h.loop, persistent: true)
            let from2 = try #require(positions[1])
            let reply = try await h.subscribe(cid, "/r", ext: #"{"resume":"\#(from2)"}"#)
            #expect(reply["ext"] == json(#"{"resume":{"recovered":true,"missed":1}}"#))
            let first = try #require(
                try await h.send(Self.connect(cid, id: "2", type: "websocket"), sink: next, type: .websocket).first)
            guard case .connect(let c) = first else {
                Issue.record("not a connect: \(first)")
                return
            }
            try await h.settle()
            let data = c.result.events.map { try! JSONParser().parse($0.json).arrayValue![0].objectValue!["data"]! }
            #expect(data + next.data == [3])
            // Then from 3, the last it read: nothing is left to send, and what comes next comes once.
            let from3 = try #require(positions[2])
            let again = try await h.subscribe(cid, "/r", ext: #"{"resume":"\#(from3)"}"#)
            #expect(again["ext"] == json(#"{"resume":{"recovered":true,"missed":0}}"#))
            _ = try await h.publish("/r", "4")
            try await h.settle()
            _ = try await h.send(Self.connect(cid, id: "3", type: "websocket"), sink: next, type: .websocket)
            try await h.settle()
            #expect(data + next.data == [3, 4])
        }
    }

    @Test(arguments: EngineKind.allCases)
    func aSessionThatLostUnconfirmedEventsIsToldWhenItComesBack(_ kind: EngineKind) async throws {
        try await withCluster(kind, configuration: BrokerConfiguration(maxQueue: 4)) { cluster in
            let h = cluster.first
            let cid = try await h.handshake()
            _ = try await h.subscribe(cid, "/r")
            let dead = RecordingSink(loop: h.loop, persistent: true)
            _ = try await h.send(Self.connect(cid, id: "1", type: "websocket"), sink: dead, type: .websocket)
            // Six events handed to a connection that never confirms: the ledger keeps four.
            for i in 1...6 {
                _ = try await h.publish("/r", "\(i)")
                try await h.settle()
            }
            #expect(dead.data == [1, 2, 3, 4, 5, 6])
            _ = h.broker.detach(cid, sink: dead, takeEvents: false)
            let reply = try await h.reply(Self.connect(cid, id: "2"))
            #expect(reply["error"] == .string("409:\(cid):Queue overflow"))
            #expect(reply["advice"]?.objectValue?["reconnect"] == "handshake")
        }
    }
}
