import Bayeux
import CompressNIO
import NIOCore
import Testing

@testable import PubSubBench

@Suite struct CompressionBenchTests {
    static func data(_ payload: BenchPayload, sequence: UInt32, sentAt: UInt64 = 1_234_567_890) -> ByteBuffer {
        var buffer = ByteBuffer()
        payload.write(into: &buffer, publisher: 2, channel: 0, sequence: sequence, sentAt: sentAt, size: 64)
        return buffer
    }

    @Test(arguments: [(BenchPayload.jobProgress, 900...1200), (.changeDoc, 3600...4700)])
    func realisticPayloadsHaveTheirSizeAndAreJSON(payload: BenchPayload, sizes: ClosedRange<Int>) throws {
        var total = 0
        for sequence: UInt32 in 0..<300 {
            let data = Self.data(payload, sequence: sequence)
            #expect(sizes.contains(data.readableBytes), "\(payload) #\(sequence): \(data.readableBytes) bytes")
            total += data.readableBytes
            let parsed = try JSONParser().parse(Array(data.readableBytesView))
            #expect(parsed.objectValue != nil)
            let marker = data.withUnsafeReadableBytes { ReplyScanner.marker(in: $0) }
            #expect(marker == ReplyScanner.Marker(publisher: 2, channel: 0, sequence: sequence, sentAt: 1_234_567_890))
        }
        let average = total / 300
        #expect(sizes.contains(average))
    }

    @Test func realisticPayloadsAreTheSameForTheSameSequence() {
        for payload in [BenchPayload.jobProgress, .changeDoc] {
            #expect(Self.data(payload, sequence: 77) == Self.data(payload, sequence: 77))
            #expect(Self.data(payload, sequence: 77) != Self.data(payload, sequence: 78))
            // Only the marker's send time differs from one run to the next.
            var a = Self.data(payload, sequence: 5, sentAt: 1)
            var b = Self.data(payload, sequence: 5, sentAt: 2)
            a.moveReaderIndex(forwardBy: 17)
            b.moveReaderIndex(forwardBy: 17)
            #expect(a == b)
        }
    }

    @Test func fillerIsAsBefore() {
        let data = Self.data(.filler, sequence: 3, sentAt: 99)
        #expect(String(buffer: data) == "{\"_pb\":[2,0,3,99],\"x\":\"" + String(repeating: "x", count: 39) + "\"}")
        #expect(data.readableBytes == 64)
    }

    /// Made by Python: `zlib.compressobj(wbits=-15)`, `compress(message) + flush(Z_SYNC_FLUSH)`, less `00 00 ff ff`.
    static let message =
        #"[{"channel":"/bench/x/fanout","data":{"_pb":[0,0,7,123456789],"type":"job.progress","steps":[{"name":"a","status":"done"},{"name":"b","status":"done"},{"name":"c","status":"pending"}]},"id":"42"}]"#
    static let deflated: [UInt8] = [
        0x7C, 0x8B, 0x41, 0x0E, 0x82, 0x30, 0x10, 0x45, 0xEF, 0xF2, 0xD7, 0x13, 0x41, 0x44, 0x51, 0xAE, 0x42, 0x88,
        0x99,
        0xD2, 0x11, 0x30, 0x3A, 0x6D, 0x68, 0x49, 0x34, 0x84, 0xBB, 0x5B, 0x5D, 0x18, 0x57, 0x2E, 0xFF, 0x7B, 0xFF,
        0x35,
        0x0B, 0xBA, 0x81, 0x55, 0xE5, 0x86, 0x1A, 0x99, 0x11, 0xED, 0x86, 0xEC, 0x91, 0x5D, 0x58, 0xDD, 0x1C, 0x41,
        0xB0,
        0x1C, 0x19, 0xF5, 0x82, 0xB3, 0x37, 0xA8, 0x9B, 0x9C, 0x72, 0xAA, 0x68, 0x5B, 0xEC, 0xCA, 0xFD, 0xA1, 0x3A,
        0x9E,
        0x5A, 0x42, 0x7C, 0x7A, 0x49, 0xE1, 0xD5, 0x99, 0x8D, 0x9F, 0x5C, 0x3F, 0x49, 0x08, 0xA9, 0x0A, 0x51, 0x7C,
        0x48,
        0xFF, 0x05, 0xCA, 0xF7, 0xB7, 0xE7, 0x0F, 0xE4, 0x38, 0x27, 0x0A, 0xEB, 0x54, 0xB0, 0xD2, 0x57, 0x9A, 0x7F,
        0xB2,
        0xFB, 0x95, 0x5E, 0xD4, 0x8E, 0xDA, 0x63, 0x6D, 0x57, 0xC2, 0x68, 0x13, 0x29, 0x8B, 0x34, 0x5E, 0x00,
    ]

    @Test func compressedFramesInflateAndZlibAloneMatchesPython() throws {
        let compression = LoopCompression()
        // Twice: the inflater is reset after each message (no context taken over).
        for _ in 0..<2 {
            let inflated = try #require(compression.inflateAnew(ByteBuffer(bytes: Self.deflated), limit: 1 << 20))
            #expect(String(buffer: inflated) == Self.message)
        }
        // Twice again, the second from the recent messages.
        for _ in 0..<2 {
            let inflated = try #require(compression.inflate(ByteBuffer(bytes: Self.deflated), limit: 1 << 20))
            #expect(String(buffer: inflated) == Self.message)
        }
        #expect(compression.inflate(ByteBuffer(bytes: [0xFF, 0xFF, 0xFF]), limit: 1 << 20) == nil)
        #expect(compression.inflate(ByteBuffer(bytes: Self.deflated), limit: 100) == nil)
        // zlib alone: the same bytes as Python's, plus a 4-byte header (126 < 131 bytes).
        #expect(compression.zlibAloneFrameBytes(ByteBuffer(string: Self.message)) == Self.deflated.count + 4)
    }

    /// Messages met again come from the recent ones, each still its own text; the recent ones are at most
    /// `recentLimit`, the oldest forgotten first.
    @Test func recentMessagesAreKeptBoundedAndReadAsTheirOwnText() throws {
        let compression = LoopCompression()
        let deflater = try ZlibCompressor(algorithm: .deflate)
        func deflated(_ text: String) throws -> ByteBuffer {
            defer { try? deflater.reset() }
            var input = ByteBuffer(string: text)
            var output = ByteBufferAllocator().buffer(capacity: deflater.maxSize(from: input) + 16)
            try deflater.deflate(from: &input, to: &output, flush: .sync)
            output.moveWriterIndex(to: output.writerIndex - 4)
            return output
        }
        let count = LoopCompression.recentLimit + 10
        let messages = try (0..<count).map { index in
            let text = "[{\"channel\":\"/a\",\"data\":{\"n\":\(index)},\"id\":\"\(index)\"}]"
            return (text, try deflated(text))
        }
        for _ in 0..<2 {
            for (text, payload) in messages {
                let inflated = try #require(compression.inflate(payload, limit: 1 << 20))
                #expect(String(buffer: inflated) == text)
                #expect(compression.recentCount <= LoopCompression.recentLimit)
            }
        }
        #expect(compression.recentCount == LoopCompression.recentLimit)
        // A known message is still held to the limit it is read with.
        #expect(compression.inflate(messages[count - 1].1, limit: 4) == nil)
        // A message larger than `recentBytesLimit` is read, and not kept.
        let large = "[{\"data\":\"" + String(repeating: "x", count: LoopCompression.recentBytesLimit) + "\"}]"
        let fresh = LoopCompression()
        let inflated = try #require(fresh.inflate(try deflated(large), limit: 1 << 20))
        #expect(String(buffer: inflated) == large)
        #expect(fresh.recentCount == 0)
    }

    @Test func aCompressedFrameIsReadWithItsRSV1AndWireLength() throws {
        var bytes = ByteBuffer(
            bytes: [0xC1, 126, 0, UInt8(Self.deflated.count)] + Self.deflated + [0x81, 2, 0x5B, 0x5D])
        let first = try #require(WebSocketWire.nextFrame(&bytes))
        #expect(first.rsv1 && first.fin && first.opcode == 1)
        #expect(first.wireBytes == 4 + Self.deflated.count)
        let second = try #require(WebSocketWire.nextFrame(&bytes))
        #expect(!second.rsv1 && second.wireBytes == 4)
        let third = WebSocketWire.nextFrame(&bytes)
        #expect(third == nil)
    }

    @Test func negotiationIsReadFromTheResponse() {
        #expect(
            PerMessageDeflate.negotiated(extensions: [
                "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
            ]))
        #expect(PerMessageDeflate.negotiated(extensions: ["x-webkit-deflate-frame, Permessage-Deflate"]))
        #expect(!PerMessageDeflate.negotiated(extensions: []))
        #expect(!PerMessageDeflate.negotiated(extensions: ["x-webkit-deflate-frame"]))
    }

    @Test func wireBytesCountOnlyInTheWindowAndSurviveTheWorkerLine() throws {
        let stats = LoopStats()
        stats.windowStart = 1000
        stats.windowEnd = 2000
        stats.wireRead(500, now: 999)
        stats.wireRead(300, now: 1000)
        stats.wireRead(200, now: 1999)
        stats.wireRead(700, now: 2000)
        #expect(stats.subscriberWireBytesInWindow == 500)
        stats.compressionNegotiated = 3
        stats.sample = CompressionSample(frames: 2, events: 2, wireBytes: 900, plainBytes: 2100, zlibBytes: 880)
        let line = WorkerReport(stats, cpuSeconds: 0, rssBytes: 0).json.jsonString
        let back = try #require(WorkerReport(json: try JSONParser().parse(line)))
        let total = WorkerReport.combine([back, back])
        #expect(total.subscriberWireBytesInWindow == 1000)
        #expect(total.compressionNegotiated == 6)
        #expect(
            total.sample == CompressionSample(frames: 4, events: 4, wireBytes: 1800, plainBytes: 4200, zlibBytes: 1760))
        let merged = LoopStats()
        merged.merge(total)
        #expect(merged.subscriberWireBytesInWindow == 1000)
    }
}
