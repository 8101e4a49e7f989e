import Bayeux
import NIOCore
import Testing

@Suite struct EventFrameTests {
    private func event(dataBytes: Int) -> ByteBuffer {
        var message = Message()
        message.channel = "/a"
        message["data"] = .string(String(repeating: "x", count: dataBytes))
        return message.encodedEvent()
    }

    /// The frame is the header RFC 6455 asks for, then the event's bytes, for each of the three header lengths.
    @Test(arguments: [10, 200, 70_000])
    func theFrameIsTheHeaderThenTheEvent(dataBytes: Int) throws {
        let event = event(dataBytes: dataBytes)
        let frame = try #require(EventFrame.webSocketFrame(of: event))
        let count = event.readableBytes
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
        expected.writeImmutableBuffer(event)
        #expect(frame == expected)
        #expect(frame.readableBytes == EventFrame.headerLength(ofPayload: count) + count)
    }

    /// Readers of the event see the JSON only: the header is before the reader index.
    @Test func theEventStillReadsAsItsJSON() {
        let event = event(dataBytes: 3)
        #expect(String(buffer: event) == #"[{"channel":"/a","data":"xxx"}]"#)
    }

    /// Bytes with no header in front (read from another node, a slice) are not taken for a frame.
    @Test func bytesWithoutTheHeaderHaveNoFrame() {
        #expect(EventFrame.webSocketFrame(of: ByteBuffer(string: #"[{"channel":"/a"}]"#)) == nil)
        var shifted = event(dataBytes: 3)
        shifted.moveReaderIndex(forwardBy: 1)
        #expect(EventFrame.webSocketFrame(of: shifted) == nil)
        var garbage = ByteBuffer(repeating: 0x81, count: 12)
        garbage.moveReaderIndex(forwardBy: 10)
        #expect(EventFrame.webSocketFrame(of: garbage) == nil)
    }

    /// Bytes from elsewhere are framed once, by a copy; an encoded event is kept as it is.
    @Test func framingCopiesOnlyWhatHasNoHeader() throws {
        let bytes = ByteBuffer(string: #"[{"channel":"/a","data":1}]"#)
        let framed = EventFrame.framed(bytes)
        #expect(framed == bytes, "readers see the same JSON")
        let frame = try #require(EventFrame.webSocketFrame(of: framed))
        #expect(frame.getInteger(at: frame.readerIndex, as: UInt8.self) == 0x81)
        #expect(frame.readableBytes == 2 + bytes.readableBytes)
        let event = event(dataBytes: 3)
        let kept = EventFrame.framed(event)
        let same = event.withUnsafeReadableBytes { e in kept.withUnsafeReadableBytes { $0.baseAddress == e.baseAddress } }
        #expect(same, "not copied")
    }

    /// The frame shares the event's storage: every recipient writes the same bytes, none are copied.
    @Test func theFrameSharesTheEventsStorage() throws {
        let event = event(dataBytes: 3)
        let frame = try #require(EventFrame.webSocketFrame(of: event))
        let same = event.withUnsafeReadableBytes { e in
            frame.withUnsafeReadableBytes { f in f.baseAddress! + EventFrame.headerLength(ofPayload: e.count) == e.baseAddress! }
        }
        #expect(same)
    }
}
