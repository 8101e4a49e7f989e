import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing

@testable import PubSubServer

/// Frames as a client puts them on the wire, and what a server wrote read back as frames.
enum WireFrames {
    /// One frame, masked as a client's are (unless `mask` is nil).
    static func bytes(
        _ opcode: WebSocketOpcode, _ payload: [UInt8], fin: Bool = true, mask: [UInt8]? = [1, 2, 3, 4],
        declaredLength: Int? = nil
    ) -> ByteBuffer {
        var out = ByteBuffer()
        out.writeInteger((fin ? 0x80 : 0) | UInt8(webSocketOpcode: opcode))
        let maskBit: UInt8 = mask == nil ? 0 : 0x80
        let count = declaredLength ?? payload.count
        if count <= 125 {
            out.writeInteger(maskBit | UInt8(count))
        } else if count <= 0xFFFF {
            out.writeInteger(maskBit | 126)
            out.writeInteger(UInt16(count))
        } else {
            out.writeInteger(maskBit | 127)
            out.writeInteger(UInt64(count))
        }
        if let mask {
            out.writeBytes(mask)
            out.writeBytes(payload.enumerated().map { $0.element ^ mask[$0.offset % 4] })
        } else {
            out.writeBytes(payload)
        }
        return out
    }

    static func bytes(_ opcode: WebSocketOpcode, _ text: String, fin: Bool = true) -> ByteBuffer {
        bytes(opcode, Array(text.utf8), fin: fin)
    }

    /// Every frame the channel wrote so far.
    static func written(_ channel: EmbeddedChannel) throws -> [WebSocketFrame] {
        var parser = WebSocketFrameParser(maxFrameSize: 1 << 24, requiresMask: false)
        while let data = try channel.readOutbound(as: IOData.self) {
            if case .byteBuffer(let buffer) = data { parser.append(buffer) }
        }
        var frames: [WebSocketFrame] = []
        while let frame = try parser.next() { frames.append(frame) }
        #expect(parser.isIdle, "no partial frame written")
        return frames
    }
}

@Suite struct WebSocketFrameParserTests {
    private func parse(_ chunks: [ByteBuffer], maxFrameSize: Int = 1000) throws(WebSocketFrameParser.ParseError)
        -> [WebSocketFrame]
    {
        var parser = WebSocketFrameParser(maxFrameSize: maxFrameSize)
        var frames: [WebSocketFrame] = []
        for chunk in chunks {
            parser.append(chunk)
            while let frame = try parser.next() { frames.append(frame) }
        }
        return frames
    }

    @Test func unmasksFramesOfEveryLengthEncoding() throws {
        for count in [0, 1, 125, 126, 300, 0xFFFF, 0x10000] {
            let payload = (0..<count).map { UInt8(truncatingIfNeeded: $0 * 7) }
            let frames = try parse([WireFrames.bytes(.binary, payload)], maxFrameSize: 1 << 20)
            #expect(frames.count == 1)
            #expect(frames.first?.opcode == .binary)
            #expect(frames.first.map { Array($0.data.readableBytesView) } == payload)
        }
    }

    @Test func aFrameCutAnywhereComesOutWhole() throws {
        var wire = WireFrames.bytes(.text, "[{\"channel\":\"/meta/connect\"}]")
        wire.writeImmutableBuffer(WireFrames.bytes(.ping, "p"))
        let all = Array(wire.readableBytesView)
        for cut in 1..<all.count {
            let frames = try parse([ByteBuffer(bytes: all[..<cut]), ByteBuffer(bytes: all[cut...])])
            #expect(frames.map(\.opcode) == [.text, .ping])
            #expect(String(buffer: frames[0].data) == "[{\"channel\":\"/meta/connect\"}]")
        }
        // Byte by byte.
        #expect(try parse(all.map { ByteBuffer(bytes: [$0]) }).count == 2)
    }

    @Test func fragmentsAreJoinedAndControlFramesPassBetweenThem() throws {
        let frames = try parse([
            WireFrames.bytes(.text, "[{\"a\":", fin: false),
            WireFrames.bytes(.ping, "x"),
            WireFrames.bytes(.continuation, "1", fin: false),
            WireFrames.bytes(.continuation, "}]"),
        ])
        #expect(frames.map(\.opcode) == [.ping, .text])
        #expect(String(buffer: frames[1].data) == "[{\"a\":1}]")
        #expect(frames[1].fin)
    }

    @Test func limitsAndProtocolErrors() {
        // One frame over the limit: known from its header, before its payload.
        #expect(throws: WebSocketFrameParser.ParseError.tooLarge) {
            try parse([WireFrames.bytes(.text, [], declaredLength: 2000)])
        }
        #expect(throws: WebSocketFrameParser.ParseError.tooLarge) {
            try parse([WireFrames.bytes(.text, [], declaredLength: 1 << 40)])
        }
        // A message over the limit in fragments under it.
        #expect(throws: WebSocketFrameParser.ParseError.tooLarge) {
            try parse([
                WireFrames.bytes(.text, [UInt8](repeating: 0x20, count: 600), fin: false),
                WireFrames.bytes(.continuation, [UInt8](repeating: 0x20, count: 600)),
            ])
        }
        #expect(throws: WebSocketFrameParser.ParseError.protocolError) {
            try parse([WireFrames.bytes(.continuation, "x")])
        }
        #expect(throws: WebSocketFrameParser.ParseError.protocolError) {
            try parse([WireFrames.bytes(.text, "a", fin: false), WireFrames.bytes(.text, "b")])
        }
        #expect(throws: WebSocketFrameParser.ParseError.protocolError) {
            try parse([WireFrames.bytes(.ping, "a", fin: false)])
        }
        #expect(throws: WebSocketFrameParser.ParseError.protocolError) {
            try parse([WireFrames.bytes(.ping, [UInt8](repeating: 1, count: 126))])
        }
    }

    /// RFC 6455 §5.1: a server fails the connection on a client frame that is not masked; §5.2: on a reserved
    /// bit set when no extension was negotiated.
    @Test func unmaskedFramesAndReservedBitsAreProtocolErrors() throws {
        #expect(throws: WebSocketFrameParser.ParseError.protocolError) {
            try parse([WireFrames.bytes(.text, Array("hello".utf8), mask: nil)])
        }
        #expect(throws: WebSocketFrameParser.ParseError.protocolError) {
            try parse([WireFrames.bytes(.ping, [], mask: nil)])
        }
        for bit: UInt8 in [0x40, 0x20, 0x10] {
            var frame = WireFrames.bytes(.text, "hello")
            frame.setInteger(frame.getInteger(at: 0, as: UInt8.self)! | bit, at: 0)
            #expect(throws: WebSocketFrameParser.ParseError.protocolError) { try parse([frame]) }
        }
        #expect(try parse([WireFrames.bytes(.text, "hello")]).map { String(buffer: $0.data) } == ["hello"])
    }

    @Test func storageStaysBoundedWhileFramesNeverLineUpWithReads() throws {
        var parser = WebSocketFrameParser(maxFrameSize: 1 << 20)
        var wire = ByteBuffer()
        for _ in 0..<200 { wire.writeImmutableBuffer(WireFrames.bytes(.text, [UInt8](repeating: 0x31, count: 10_000))) }
        var frames = 0
        var largest = 0
        while wire.readableBytes > 0 {
            // 7,777-byte reads: every read ends in the middle of a frame.
            parser.append(wire.readSlice(length: min(7_777, wire.readableBytes))!)
            while try parser.next() != nil { frames += 1 }
            largest = max(largest, parser.pendingCapacity)
        }
        #expect(frames == 200)
        #expect(largest < 64 * 1024, "the storage of read frames is given back: \(largest) bytes held")
    }

    @Test func keepsNothingOnceAFrameIsRead() throws {
        var parser = WebSocketFrameParser(maxFrameSize: 100)
        let wire = Array(WireFrames.bytes(.text, "hello").readableBytesView)
        parser.append(ByteBuffer(bytes: wire[..<3]))
        #expect(try parser.next() == nil)
        #expect(!parser.isIdle)
        parser.append(ByteBuffer(bytes: wire[3...]))
        #expect(try parser.next().map { String(buffer: $0.data) } == "hello")
        #expect(parser.isIdle)
    }

    @Test func headersAreWrittenInPlaceOrApart() throws {
        for count in [0, 5, 125, 126, 70000] {
            // In place: the payload leaves room in front.
            var payload = ByteBuffer()
            payload.reserveCapacity(count + WebSocketFrameHeader.maxLength)
            payload.moveWriterIndex(forwardBy: WebSocketFrameHeader.maxLength)
            payload.moveReaderIndex(forwardBy: WebSocketFrameHeader.maxLength)
            payload.writeRepeatingByte(0x41, count: count)
            #expect(WebSocketFrameHeader.prepend(opcode: .text, to: &payload))
            var parser = WebSocketFrameParser(maxFrameSize: 1 << 20, requiresMask: false)
            parser.append(payload)
            let frame = try #require(try parser.next())
            #expect(frame.opcode == .text && frame.fin && frame.data.readableBytes == count)

            // Apart: a shared buffer is never written into.
            let shared = ByteBuffer(repeating: 0x42, count: count)
            var copy = shared
            #expect(!WebSocketFrameHeader.prepend(opcode: .text, to: &copy))
            var wire = WebSocketFrameHeader.buffer(opcode: .text, payloadLength: count, allocator: ByteBufferAllocator())
            wire.writeImmutableBuffer(shared)
            parser.append(wire)
            #expect(try parser.next()?.data == shared)
        }
    }

    @Test func acceptValueIsTheOneOfTheRFC() {
        // RFC 6455 §1.3.
        #expect(WebSocketUpgrader.acceptValue(key: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    }
}
