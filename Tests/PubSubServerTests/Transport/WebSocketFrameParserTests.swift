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
    static func written(_ channel: EmbeddedChannel) throws -> [WebSocketFrameParser.Frame] {
        var parser = WebSocketFrameParser(maxFrameSize: 1 << 24, requiresMask: false)
        while let data = try channel.readOutbound(as: IOData.self) {
            if case .byteBuffer(let buffer) = data { parser.append(buffer) }
        }
        var frames: [WebSocketFrameParser.Frame] = []
        while let frame = try parser.next() { frames.append(frame) }
        #expect(parser.isIdle, "no partial frame written")
        return frames
    }
}

@Suite struct WebSocketFrameParserTests {
    private func parse(_ chunks: [ByteBuffer], maxFrameSize: Int = 1000) throws(WebSocketFrameParser.ParseError)
        -> [WebSocketFrameParser.Frame]
    {
        var parser = WebSocketFrameParser(maxFrameSize: maxFrameSize)
        var frames: [WebSocketFrameParser.Frame] = []
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

    /// RFC 6455 §5.2: opcodes 3–7 and 0xB–0xF are reserved; a frame with one fails the connection (and is not
    /// passed on as a control frame).
    @Test func reservedOpcodesAreProtocolErrors() throws {
        for bits: UInt8 in [3, 4, 5, 6, 7, 11, 12, 13, 14, 15] {
            let opcode = try #require(WebSocketOpcode(encodedWebSocketOpcode: bits))
            #expect(throws: WebSocketFrameParser.ParseError.protocolError, "opcode \(bits)") {
                try parse([WireFrames.bytes(opcode, "x"), WireFrames.bytes(.ping, "p")])
            }
            // Empty, and between the fragments of a message.
            #expect(throws: WebSocketFrameParser.ParseError.protocolError, "opcode \(bits)") {
                try parse([WireFrames.bytes(.text, "a", fin: false), WireFrames.bytes(opcode, [])])
            }
        }
        // The six defined ones (1, 9, 0, 2, 8, 10) go on.
        let defined = try parse([
            WireFrames.bytes(.text, "a", fin: false), WireFrames.bytes(.ping, []), WireFrames.bytes(.continuation, "b"),
            WireFrames.bytes(.binary, []), WireFrames.bytes(.connectionClose, []), WireFrames.bytes(.pong, []),
        ])
        #expect(defined.map(\.opcode) == [.ping, .text, .binary, .connectionClose, .pong])
    }

    /// RFC 6455 §5.5.1, §7.4: a close body is empty, or a status code a peer may send and a UTF-8 reason.
    @Test func closeBodiesAreCheckedAndPassedOnAsTheyAre() throws {
        func close(_ body: [UInt8]) throws(WebSocketFrameParser.ParseError) -> [UInt8]? {
            try parse([WireFrames.bytes(.connectionClose, body)]).first.map { Array($0.data.readableBytesView) }
        }
        #expect(try close([]) == [])
        for code: UInt16 in [
            1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999,
        ] {
            let body = [UInt8(code >> 8), UInt8(code & 0xFF)]
            #expect(try close(body) == body, "code \(code)")
            let withReason = body + Array("bye, ça va 👋".utf8)
            #expect(try close(withReason) == withReason, "code \(code) with a reason")
        }
        // Between the fragments of a message too.
        let between = try parse([
            WireFrames.bytes(.text, "a", fin: false), WireFrames.bytes(.connectionClose, [0x03, 0xE9]),
        ])
        #expect(between.map(\.opcode) == [.connectionClose])

        #expect(throws: WebSocketFrameParser.ParseError.protocolError, "one byte") { try close([0x03]) }
        for code: UInt16 in [0, 1, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 0xFFFF] {
            #expect(throws: WebSocketFrameParser.ParseError.protocolError, "code \(code)") {
                try close([UInt8(code >> 8), UInt8(code & 0xFF)])
            }
        }
        for reason: [UInt8] in [[0xFF], [0xC3], [0xE2, 0x82], [0xED, 0xA0, 0x80], [0xC0, 0xAF], [0x61, 0x80]] {
            #expect(throws: WebSocketFrameParser.ParseError.protocolError, "reason \(reason)") {
                try close([0x03, 0xE8] + reason)
            }
        }
    }

    /// RFC 6455 §8.1: text that is not UTF-8 fails the connection as soon as it is seen, in the fragment that
    /// holds it; a character may be split between fragments, but a message may not end inside one.
    @Test func fragmentedTextIsValidatedAsItArrives() throws {
        let emoji: [UInt8] = [0xF0, 0x9F, 0x91, 0x8B]  // U+1F44B, four bytes
        for split in 1..<4 {
            let frames = try parse([
                WireFrames.bytes(.text, Array("[\"".utf8) + emoji[..<split], fin: false),
                WireFrames.bytes(.continuation, Array(emoji[split...]) + Array("\"]".utf8)),
            ])
            #expect(frames.count == 1)
            #expect(frames.first.map { String(buffer: $0.data) } == "[\"👋\"]", "split \(split)+\(4 - split)")
        }
        // One byte a fragment, with a ping between.
        let pieces = emoji.enumerated().map { index, byte in
            WireFrames.bytes(index == 0 ? .text : .continuation, [byte], fin: index == 3)
        }
        let oneByOne = try parse([pieces[0], pieces[1], WireFrames.bytes(.ping, []), pieces[2], pieces[3]])
        #expect(oneByOne.map(\.opcode) == [.ping, .text])

        // An invalid byte in the first fragment: caught before the last fragment arrives.
        var parser = WebSocketFrameParser(maxFrameSize: 1000)
        parser.append(WireFrames.bytes(.text, [0x5B, 0x22, 0xFF], fin: false))
        #expect(throws: WebSocketFrameParser.ParseError.invalidUTF8) { try parser.next() }
        // A lead byte whose continuation, in the next fragment, is not one.
        #expect(throws: WebSocketFrameParser.ParseError.invalidUTF8) {
            try parse([
                WireFrames.bytes(.text, [0xE2], fin: false), WireFrames.bytes(.continuation, [0x41], fin: false),
            ])
        }
        // A surrogate and an overlong form, split.
        #expect(throws: WebSocketFrameParser.ParseError.invalidUTF8) {
            try parse([WireFrames.bytes(.text, [0xED], fin: false), WireFrames.bytes(.continuation, [0xA0, 0x80])])
        }
        #expect(throws: WebSocketFrameParser.ParseError.invalidUTF8) {
            try parse([WireFrames.bytes(.text, [0xE0], fin: false), WireFrames.bytes(.continuation, [0x80, 0x80])])
        }
        // A message that ends inside a character.
        #expect(throws: WebSocketFrameParser.ParseError.invalidUTF8) {
            try parse([
                WireFrames.bytes(.text, Array(emoji[..<2]), fin: false), WireFrames.bytes(.continuation, [0x91]),
            ])
        }
        // Binary messages are not text.
        let binary = try parse([
            WireFrames.bytes(.binary, [0xFF, 0xF0], fin: false), WireFrames.bytes(.continuation, [0xC3]),
        ])
        #expect(binary.map { Array($0.data.readableBytesView) } == [[0xFF, 0xF0, 0xC3]])
        // A text message of one frame is left to the JSON parser (it reads every byte anyway).
        #expect(try parse([WireFrames.bytes(.text, [0xFF])]).count == 1)
        // The next message starts afresh after one that ended between characters.
        #expect(
            try parse([
                WireFrames.bytes(.text, [0xC3], fin: false), WireFrames.bytes(.continuation, [0xA7]),
                WireFrames.bytes(.text, [0xC3], fin: false), WireFrames.bytes(.continuation, [0xA9]),
            ]).map { String(buffer: $0.data) } == ["ç", "é"])
    }

    /// The validator against the standard library's, on every sequence of one and two bytes, on three-byte
    /// sequences around every lead byte's bounds, each cut at every point.
    @Test func utf8ValidatorAgreesWithTheStandardLibrary() {
        func pieces(_ bytes: [UInt8], cut: Int) -> Bool {
            var validator = UTF8Validator()
            let valid =
                bytes[..<cut].withUnsafeBytes { validator.validate($0) }
                && bytes[cut...].withUnsafeBytes { validator.validate($0) }
            return valid && validator.isComplete
        }
        var mismatches: [[UInt8]] = []
        let edges: [UInt8] = [
            0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4,
            0xF5, 0xFF,
        ]
        var inputs: [[UInt8]] = (0...255).map { [UInt8($0)] }
        for a in 0...255 { for b in 0...255 { inputs.append([UInt8(a), UInt8(b)]) } }
        for a in 0xC0...0xFF { for b in edges { for c in edges { inputs.append([UInt8(a), b, c]) } } }
        for a in 0xF0...0xF5 {
            for b in edges { for c in edges { for d in edges { inputs.append([UInt8(a), b, c, d]) } } }
        }
        // Long ASCII runs (the eight-byte path) with a bad byte at every place.
        for at in 0..<20 {
            var run = [UInt8](repeating: 0x61, count: 20)
            run[at] = 0x80
            inputs.append(run)
        }
        for input in inputs {
            let expected = String(validating: input, as: UTF8.self) != nil
            for cut in 0...input.count where pieces(input, cut: cut) != expected {
                mismatches.append(input)
                break
            }
        }
        #expect(mismatches.isEmpty, "\(mismatches.prefix(10))")
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
            var wire = WebSocketFrameHeader.buffer(
                opcode: .text, payloadLength: count, allocator: ByteBufferAllocator())
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
