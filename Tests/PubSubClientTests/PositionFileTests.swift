import Bayeux
import Foundation
import Testing

@testable import PubSubClient

@Suite struct PositionFileTests {
    private func folder() throws -> String {
        let path = NSTemporaryDirectory() + "positions-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    @Test func noFileIsAFirstRun() throws {
        let file = PositionFile(path: try folder() + "/positions.json")
        #expect(try file.read() == nil)
    }

    @Test func writesThenReadsBackWithNothingLeftBehind() throws {
        let dir = try folder()
        let file = PositionFile(path: dir + "/positions.json")
        let positions = SubscriptionPositions(["/jobs/*": "2.abc.def", "/chat/room": "2.abc.xyz"])
        try file.write(positions, durable: true)
        #expect(try file.read() == positions)
        try file.write(SubscriptionPositions(["/jobs/*": "2.abc.ghi"]), durable: false)
        #expect(try file.read() == SubscriptionPositions(["/jobs/*": "2.abc.ghi"]))
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir) == ["positions.json"])
        let text = try String(contentsOfFile: dir + "/positions.json", encoding: .utf8)
        #expect(text == #"{"version":1,"positions":{"/jobs/*":"2.abc.ghi"}}"# + "\n")
    }

    @Test(arguments: [
        ("", "empty"),
        ("{\"version\":1,\"positions\":{\"/a\":\"2.x", "not JSON"),
        ("[1,2]", "no version"),
        ("{\"version\":2,\"positions\":{}}", "version 2"),
        ("{\"version\":1}", "no positions object"),
        ("{\"version\":1,\"positions\":{\"/a\":null}}", "the position of /a is not a string"),
    ])
    func aCorruptFileIsAClearOneLineError(content: String, why: String) throws {
        let path = try folder() + "/positions.json"
        try content.write(toFile: path, atomically: false, encoding: .utf8)
        let error = #expect(throws: PositionFile.Error.self) { try PositionFile(path: path).read() }
        let message = error?.message ?? ""
        #expect(message.contains(path) && message.contains("corrupt") && message.contains(why), "\(message)")
        #expect(!message.contains("\n"))
    }

    @Test func anUnwritableFolderIsAnError() throws {
        let file = PositionFile(path: "/nonexistent-\(UUID().uuidString)/positions.json")
        let error = #expect(throws: PositionFile.Error.self) {
            try file.write(SubscriptionPositions(["/a": "2.x.y"]), durable: true)
        }
        #expect(error?.message.contains("cannot create") == true)
    }

    @Test func recordsAMessageOnEverySubscriptionItMatches() {
        var positions = SubscriptionPositions(["/jobs/*": "2.a.1", "/jobs/**": "2.a.1", "/chat/room": "2.a.1"])
        var message = Message()
        message.channel = "/jobs/42"
        message.ext = ["position": "2.a.2"]
        let matched = positions.record(message)
        #expect(matched)
        #expect(positions.byChannel == ["/jobs/*": "2.a.2", "/jobs/**": "2.a.2", "/chat/room": "2.a.1"])
        message.ext = nil
        let withoutPosition = positions.record(message)
        #expect(!withoutPosition)  // no position: a broker with history off
        message.channel = "/other"
        message.ext = ["position": "2.a.3"]
        let elsewhere = positions.record(message)
        #expect(!elsewhere)
    }
}

/// A subscription's position after each message: replaced, or (from a broker spread over shards) the part of the
/// message's shard replaced in the handshake's vector.
@Suite struct SubscriptionPositionsTests {
    func message(_ channel: String, _ position: String) throws -> Message {
        Message(
            try JSONParser().parse(#"{"channel":"\#(channel)","data":1,"ext":{"position":"\#(position)"}}"#)
                .objectValue!)
    }

    @Test func aPositionReplacesTheOneBefore() throws {
        var positions = SubscriptionPositions(["/jobs/*": "2.e1.a", "/chat": "2.e1.b"])
        #expect(positions.record(try message("/jobs/1", "2.e1.c")))
        #expect(positions.byChannel == ["/jobs/*": "2.e1.c", "/chat": "2.e1.b"])
        #expect(!positions.record(try message("/other", "2.e1.d")))
    }

    @Test func aVectorKeepsOnePartPerShard() throws {
        var positions = SubscriptionPositions(["/**": "2.e1.a~2.e2.b~2.e3.c"])
        positions.record(try message("/x", "2.e2.z"))
        #expect(positions[channel: "/**"] == "2.e1.a~2.e2.z~2.e3.c")
        positions.record(try message("/y", "2.e1.q"))
        #expect(positions[channel: "/**"] == "2.e1.q~2.e2.z~2.e3.c")
        // A position of no shard the vector knows (the broker lost its data: a new epoch) starts over from it.
        positions.record(try message("/y", "2.e9.r"))
        #expect(positions[channel: "/**"] == "2.e9.r")
    }
}
