import PubSubTesting
import Testing

@testable import PubSubRelay

/// Golden frames written by hand from `BLIP Protocol.md` (v3); the CRC-32 values were computed independently with
/// Python's `zlib.crc32(payload, running_crc)` and pasted here.
@Suite struct BLIPCodecTests {
    /// Client → server: MSG #1, flags 0x00, Profile=subChanges since="12::34" continuous=true batch=200, no body.
    static let subChangesFrame: [UInt8] = [
        0x01,  // request number 1
        0x00,  // flags: MSG, nothing else
        0x3C,  // properties length 60
        0x50, 0x72, 0x6F, 0x66, 0x69, 0x6C, 0x65, 0x00,  // "Profile\0"
        0x73, 0x75, 0x62, 0x43, 0x68, 0x61, 0x6E, 0x67, 0x65, 0x73, 0x00,  // "subChanges\0"
        0x73, 0x69, 0x6E, 0x63, 0x65, 0x00,  // "since\0"
        0x22, 0x31, 0x32, 0x3A, 0x3A, 0x33, 0x34, 0x22, 0x00,  // "\"12::34\"\0" (the JSON-encoded seq)
        0x63, 0x6F, 0x6E, 0x74, 0x69, 0x6E, 0x75, 0x6F, 0x75, 0x73, 0x00,  // "continuous\0"
        0x74, 0x72, 0x75, 0x65, 0x00,  // "true\0"
        0x62, 0x61, 0x74, 0x63, 0x68, 0x00,  // "batch\0"
        0x32, 0x30, 0x30, 0x00,  // "200\0"
        0x2D, 0xDD, 0x00, 0x37,  // CRC-32 of the 61 payload bytes (zlib.crc32 = 0x2DDD0037)
    ]

    /// Server → client, in this order (the checksum runs across them):
    /// RPY #1, flags 0x01, empty (properties length 0).
    static let replyFrame: [UInt8] = [0x01, 0x01, 0x00, 0xD2, 0x02, 0xEF, 0x8D]
    /// MSG #1 `changes` in two frames; first frame: flags 0x40 (MoreComing), 20 payload bytes.
    static let changesFrame1: [UInt8] = [
        0x01, 0x40,
        0x10,  // properties length 16
        0x50, 0x72, 0x6F, 0x66, 0x69, 0x6C, 0x65, 0x00,  // "Profile\0"
        0x63, 0x68, 0x61, 0x6E, 0x67, 0x65, 0x73, 0x00,  // "changes\0"
        0x5B, 0x5B, 0x31,  // `[[1`: the body starts
        0x28, 0x66, 0x43, 0x80,  // running CRC after 1 + 20 bytes
    ]
    /// Second frame: flags 0x00 (last), the rest of `[[13,"doc1","1-a"],[14,"doc2","2-b",true]]`.
    static let changesFrame2: [UInt8] = [
        0x01, 0x00,
        // 3,"doc1","1-a"],
        0x33, 0x2C, 0x22, 0x64, 0x6F, 0x63, 0x31, 0x22, 0x2C, 0x22, 0x31, 0x2D, 0x61, 0x22, 0x5D, 0x2C,
        // [14,"doc2","2-b"
        0x5B, 0x31, 0x34, 0x2C, 0x22, 0x64, 0x6F, 0x63, 0x32, 0x22, 0x2C, 0x22, 0x32, 0x2D, 0x62, 0x22,
        0x2C, 0x74, 0x72, 0x75, 0x65, 0x5D, 0x5D,  // ,true]]
        0x14, 0xD9, 0x27, 0xF7,
    ]
    /// ERR #2, flags 0x02: Error-Domain=HTTP, Error-Code=400, body "Invalid sequence".
    static let errorFrame: [UInt8] = [
        0x02, 0x02,
        0x21,  // properties length 33
        0x45, 0x72, 0x72, 0x6F, 0x72, 0x2D, 0x44, 0x6F, 0x6D, 0x61, 0x69, 0x6E, 0x00,  // "Error-Domain\0"
        0x48, 0x54, 0x54, 0x50, 0x00,  // "HTTP\0"
        0x45, 0x72, 0x72, 0x6F, 0x72, 0x2D, 0x43, 0x6F, 0x64, 0x65, 0x00,  // "Error-Code\0"
        0x34, 0x30, 0x30, 0x00,  // "400\0"
        0x49, 0x6E, 0x76, 0x61, 0x6C, 0x69, 0x64, 0x20, 0x73, 0x65, 0x71, 0x75, 0x65, 0x6E, 0x63, 0x65,
        0xB6, 0x5C, 0xD6, 0xEF,
    ]
    /// RPY #3, flags 0x09 (RPY | Compressed): body "hello hello hello hello", raw deflate (zlib wbits=-15,
    /// Z_SYNC_FLUSH) with the trailing 00 00 FF FF stripped; the CRC is over the uncompressed payload.
    static let compressedFrame: [UInt8] = [
        0x03, 0x09,
        0x62, 0xC8, 0x48, 0xCD, 0xC9, 0xC9, 0x57, 0xC0, 0x20, 0x01, 0x00,
        0x56, 0xE5, 0xE9, 0x5A,
    ]
    /// ACKMSG for our request #5, flags 0x34 (ACKMSG | Urgent | NoReply): 50000 bytes received; no checksum.
    static let ackFrame: [UInt8] = [0x05, 0x34, 0xD0, 0x86, 0x03]

    @Test func varintsAreUnsignedLEB128() {
        #expect(BLIPVarint.encode(0) == [0x00])
        #expect(BLIPVarint.encode(127) == [0x7F])
        #expect(BLIPVarint.encode(300) == [0xAC, 0x02])
        #expect(BLIPVarint.encode(50000) == [0xD0, 0x86, 0x03])
        #expect(BLIPVarint.encode(UInt64.max) == [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01])
        var offset = 0
        #expect(
            BLIPVarint.read([0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], at: &offset) == UInt64.max)
        offset = 0
        #expect(BLIPVarint.read([0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02], at: &offset) == nil)
        offset = 0
        #expect(BLIPVarint.read([0x80, 0x80], at: &offset) == nil)
    }

    @Test func encodesTheSubChangesRequestByteForByte() throws {
        var encoder = BLIPFrameEncoder()
        let number = encoder.nextRequestNumber()
        let message = BLIPMessage(
            type: .request, number: number,
            properties: [
                ("Profile", "subChanges"), ("since", "\"12::34\""), ("continuous", "true"), ("batch", "200"),
            ])
        #expect(try encoder.frames(for: message) == [Self.subChangesFrame])
    }

    @Test func encodesRepliesErrorsAndACKsByteForByte() throws {
        var encoder = BLIPFrameEncoder()
        #expect(try encoder.frames(for: BLIPMessage(type: .response, number: 1)) == [Self.replyFrame])
        #expect(BLIPFrameEncoder.ack(.ackRequest, number: 5, received: 50000) == Self.ackFrame)
        // The ERR frame from a fresh checksum: same header and payload as the golden one (whose CRC continues the
        // server's stream), and the CRC of the payload alone.
        var fresh = BLIPFrameEncoder()
        let error = BLIPMessage(
            type: .error, number: 2, properties: [("Error-Domain", "HTTP"), ("Error-Code", "400")],
            body: Array("Invalid sequence".utf8))
        let frames = try fresh.frames(for: error)
        #expect(frames.count == 1)
        #expect(frames[0].dropLast(4).elementsEqual(Self.errorFrame.dropLast(4)))
        #expect(frames[0].suffix(4).elementsEqual([0x80, 0x1B, 0xA9, 0xE4]))  // zlib.crc32(payload) = 0x801BA9E4
    }

    @Test func splitsLongMessagesWithMoreComing() throws {
        var encoder = BLIPFrameEncoder(maxFramePayload: 20)
        let changes = BLIPMessage(
            type: .request, number: 1, properties: [("Profile", "changes")],
            body: Array(#"[[13,"doc1","1-a"],[14,"doc2","2-b",true]]"#.utf8))
        let frames = try encoder.frames(for: changes)
        #expect(frames.map(\.count) == [2 + 20 + 4, 2 + 20 + 4, 2 + 19 + 4])
        #expect(frames.map { $0[1] } == [0x40, 0x40, 0x00])
        // The first frame is the golden first frame up to its CRC (same 20 bytes, but a fresh checksum).
        #expect(frames[0].dropLast(4).elementsEqual(Self.changesFrame1.dropLast(4)))
        var decoder = BLIPFrameDecoder()
        var events: [BLIPFrameDecoder.Event] = []
        for frame in frames { events += try decoder.receive(frame) }
        #expect(events == [.message(changes)])
    }

    @Test func decodesTheGoldenServerStream() throws {
        var decoder = BLIPFrameDecoder()
        #expect(try decoder.receive(Self.replyFrame) == [.message(BLIPMessage(type: .response, number: 1))])
        #expect(try decoder.receive(Self.changesFrame1) == [])
        let changes = try decoder.receive(Self.changesFrame2)
        #expect(
            changes == [
                .message(
                    BLIPMessage(
                        type: .request, number: 1, properties: [("Profile", "changes")],
                        body: Array(#"[[13,"doc1","1-a"],[14,"doc2","2-b",true]]"#.utf8)))
            ])
        let error = try decoder.receive(Self.errorFrame)
        guard case .message(let message)? = error.first else {
            Issue.record("no ERR message")
            return
        }
        #expect(message.type == .error && message.number == 2)
        #expect(message["Error-Domain"] == "HTTP" && message["Error-Code"] == "400")
        #expect(message.errorDescription == "HTTP 400 Invalid sequence")
        let compressed = try decoder.receive(Self.compressedFrame)
        #expect(
            compressed == [
                .message(
                    BLIPMessage(
                        type: .response, number: 3, flags: .compressed,
                        body: Array("hello hello hello hello".utf8)))
            ])
        #expect(try decoder.receive(Self.ackFrame) == [.ack(.request, number: 5, received: 50000)])
        #expect(decoder.checksum.value == 0x56E5_E95A)
    }

    @Test func aRequestAndAReplyWithTheSameNumberAreReassembledApart() throws {
        // Frames built by hand and interleaved: MSG #1 (3 frames) and RPY #1 (2 frames).
        var crc = BLIPCRC32()
        func frame(_ flags: UInt8, _ payload: [UInt8]) -> [UInt8] {
            crc.update(payload)
            let value = crc.value
            return [0x01, flags] + payload + [
                UInt8(value >> 24), UInt8(value >> 16 & 0xFF), UInt8(value >> 8 & 0xFF),
                UInt8(value & 0xFF),
            ]
        }
        let request = [0x0A] + Array("Profile\0x\0".utf8) + Array("[1,2,3]".utf8)
        let reply = [0x00] + Array("reply body".utf8)
        let frames = [
            frame(0x40, Array(request[0..<6])), frame(0x41, Array(reply[0..<4])),
            frame(0x40, Array(request[6..<12])), frame(0x01, Array(reply[4...])),
            frame(0x00, Array(request[12...])),
        ]
        var decoder = BLIPFrameDecoder()
        var messages: [BLIPMessage] = []
        for frame in frames {
            for case .message(let message) in try decoder.receive(frame) { messages.append(message) }
        }
        #expect(
            messages == [
                BLIPMessage(type: .response, number: 1, body: Array("reply body".utf8)),
                BLIPMessage(type: .request, number: 1, properties: [("Profile", "x")], body: Array("[1,2,3]".utf8)),
            ])
    }

    @Test func compressedMultiFrameMessagesRoundTripAndAskForACKs() throws {
        var encoder = BLIPFrameEncoder(maxFramePayload: 4096)
        var decoder = BLIPFrameDecoder()
        // Hardly compressible: random document ids, so the frames stay large after deflate.
        var random = SeededGenerator(seed: 42)
        let body = (0..<8000).map { "[\($0),\"\(String(random.next(), radix: 36))\",\"1-abcdef\"]" }.joined(
            separator: ",")
        let message = BLIPMessage(
            type: .request, number: 7, properties: [("Profile", "changes")],
            body: Array("[\(body)]".utf8))
        let frames = try encoder.frames(for: message, compress: true)
        #expect(frames.count > 10)
        #expect(frames.allSatisfy { $0[1] & 0x08 != 0 })
        #expect(frames.dropLast().allSatisfy { $0[1] & 0x40 != 0 } && frames.last![1] & 0x40 == 0)
        var events: [BLIPFrameDecoder.Event] = []
        for frame in frames { events += try decoder.receive(frame) }
        let acks = events.filter { if case .sendAck = $0 { return true } else { return false } }
        #expect(!acks.isEmpty)
        #expect(events.last == .message(message.with(flags: .compressed)))
    }

    @Test func aCorruptedChecksumIsFatal() throws {
        var decoder = BLIPFrameDecoder()
        var frame = Self.replyFrame
        frame[frame.count - 1] ^= 0x01
        expectRelayError(.blipProtocol) { try decoder.receive(frame) }
        var second = BLIPFrameDecoder()
        _ = try second.receive(Self.replyFrame)
        // A frame valid on its own but out of order fails the running checksum.
        expectRelayError(.blipProtocol) { try second.receive(Self.errorFrame) }
    }

    @Test func badDeflateDataAndEmptyFramesAreFatal() {
        var decoder = BLIPFrameDecoder()
        expectRelayError(.blipProtocol) { try decoder.receive([0x01, 0x09, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]) }
        var empty = BLIPFrameDecoder()
        expectRelayError(.blipProtocol) { try empty.receive([]) }
        expectRelayError(.blipProtocol) { try empty.receive([0x01]) }
    }

    @Test func garbageNeverCrashes() {
        var generator = SeededGenerator(seed: 0x5EED_B11F)
        for round in 0..<3000 {
            var decoder = BLIPFrameDecoder(maxMessageSize: 1 << 16)
            let frames = round % 3 == 0 ? 1 : 4
            for _ in 0..<frames {
                var frame = (0..<Int.random(in: 0...64, using: &generator)).map { _ in
                    UInt8.random(in: 0...255, using: &generator)
                }
                if round % 2 == 0, frame.count > 2 { frame[1] = UInt8.random(in: 0...0x7F, using: &generator) }
                do { _ = try decoder.receive(frame) } catch is RelayError {} catch {
                    Issue.record("unexpected error type \(error)")
                }
            }
            // Mutated valid frames too.
            var valid = Self.subChangesFrame
            valid[Int.random(in: 0..<valid.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator)
            var fresh = BLIPFrameDecoder()
            _ = try? fresh.receive(valid)
        }
    }
}

extension BLIPMessage {
    func with(flags: BLIPFlags) -> BLIPMessage {
        var copy = self
        copy.flags = flags
        return copy
    }
}
