import Bayeux
import NIOCore
import Testing

@testable import PubSubCore

@Suite struct WireEventTests {
    private func message(dataBytes: Int) -> Message {
        var message = Message()
        message.channel = "/a"
        message["data"] = .string(String(repeating: "x", count: dataBytes))
        return message
    }

    /// The frame is the header RFC 6455 asks for, then the event's JSON, for each of the three header lengths;
    /// the JSON is the message's encoding.
    @Test(arguments: [10, 200, 70_000])
    func theFrameIsTheHeaderThenTheJSON(dataBytes: Int) throws {
        let message = message(dataBytes: dataBytes)
        let event = WireEvent(encoding: message)
        #expect(event.json == message.encodedEvent())
        let count = event.json.readableBytes
        var expected = ByteBuffer(bytes: [0x81])
        if count <= 125 {
            expected.writeInteger(UInt8(count))
        } else if count <= 0xFFFF {
            expected.writeInteger(UInt8(126))
            expected.writeInteger(UInt16(count))
        } else {
            expected.writeInteger(UInt8(127))
            expected.writeInteger(UInt64(count))
        }
        expected.writeImmutableBuffer(event.json)
        #expect(event.frame == expected)
        #expect(event.frame.readableBytes == WireEvent.headerLength(ofPayload: count) + count)
        #expect(event.compressed == nil, "no compression asked for")
    }

    /// Bytes encoded elsewhere (another node's event) get the same JSON and frame as the event made here.
    @Test func bytesFromElsewhereGetTheSameFrame() {
        let message = message(dataBytes: 3)
        let here = WireEvent(encoding: message)
        let there = WireEvent(json: message.encodedEvent())
        #expect(there.json == here.json)
        #expect(there.frame == here.frame)
        #expect(there == here, "equal by their JSON: a resume's range is found in a queue")
        #expect(Set([here, there]).count == 1)
    }

    /// The frame shares the JSON's storage: every recipient writes the same bytes, none are copied.
    @Test func theFrameSharesTheJSONsStorage() {
        let event = WireEvent(encoding: message(dataBytes: 3))
        let same = event.json.withUnsafeReadableBytes { e in
            event.frame.withUnsafeReadableBytes { f in
                f.baseAddress! + WireEvent.headerLength(ofPayload: e.count) == e.baseAddress!
            }
        }
        #expect(same)
    }

    /// The JSON holds nothing but the JSON: its reader index starts at its first byte, and a copy of its bytes is
    /// equal to it.
    @Test func theJSONIsOnlyTheJSON() {
        let event = WireEvent(encoding: message(dataBytes: 3))
        #expect(String(buffer: event.json) == #"[{"channel":"/a","data":"xxx"}]"#)
        #expect(event.json.readerIndex == 0)
        #expect(event.json == ByteBuffer(string: #"[{"channel":"/a","data":"xxx"}]"#))
    }
}
