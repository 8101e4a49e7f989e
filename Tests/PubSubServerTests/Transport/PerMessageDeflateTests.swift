import Bayeux
import NIOCore
import NIOHTTP1
import Testing

@testable import PubSubCore
@testable import PubSubServer

/// permessage-deflate: what is negotiated, the compressed frame an event carries, and the bounded inflate of what
/// clients send.
@Suite struct PerMessageDeflateTests {
    static func offer(_ values: String...) -> HTTPHeaders {
        HTTPHeaders(values.map { ("Sec-WebSocket-Extensions", $0) })
    }

    @Test func theOffersBrowsersAndLibrariesMakeAreAccepted() {
        for value in [
            "permessage-deflate; client_max_window_bits",  // Chromium, Python websockets
            "permessage-deflate",  // Firefox
            "permessage-deflate; client_max_window_bits=12; server_no_context_takeover",
            "permessage-deflate; server_max_window_bits=15",
            "PerMessage-Deflate ;  client_no_context_takeover",
        ] {
            #expect(PerMessageDeflate.negotiate(Self.offer(value)) == PerMessageDeflate.response, "\(value)")
        }
    }

    @Test func offersThisServerCannotHonourAreDeclined() {
        for value in [
            "permessage-deflate; server_max_window_bits=10",  // every event is compressed once, with 15 bits
            "permessage-deflate; client_max_window_bits=16",
            "permessage-deflate; mystery",
            "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
            "permessage-deflate; server_no_context_takeover=1",
            "x-webkit-deflate-frame",
            "",
        ] {
            #expect(PerMessageDeflate.negotiate(Self.offer(value)) == nil, "\(value)")
        }
        #expect(PerMessageDeflate.negotiate([:]) == nil)
    }

    @Test func theFirstOfferThatCanBeHonouredIsTaken() {
        let headers = Self.offer(
            "permessage-deflate; server_max_window_bits=9, permessage-deflate; client_max_window_bits")
        #expect(PerMessageDeflate.negotiate(headers) == PerMessageDeflate.response)
        #expect(PerMessageDeflate.negotiate(Self.offer("foo", "permessage-deflate")) == PerMessageDeflate.response)
    }

    static func jobProgress(bytes: Int) -> ByteBuffer {
        var message = Message()
        message.channel = "/jobs/42"
        var steps: [JSONValue] = []
        var n = 0
        while true {
            steps.append(
                .object(["step": .string("resize-image-\(n)"), "status": .string("done"), "percent": JSONValue(n)]))
            message["data"] = .object(["job": .string("42"), "steps": .array(steps)])
            if message.encodedEvent().readableBytes >= bytes { return message.encodedEvent() }
            n += 1
        }
    }

    /// An event is compressed once: its `WireEvent` carries the compressed frame (FIN, RSV1, text) beside the
    /// plain one, and the plain frame and the JSON every other reader sees are as they were.
    @Test func anEventCarriesItsCompressedFrameBesideThePlainOne() throws {
        let json = Self.jobProgress(bytes: 1024)
        let event = WireEvent(json: json, compression: EventCompression())
        let plain = WireEvent(json: json)
        #expect(event.json == json)
        #expect(event.frame == plain.frame)
        #expect(plain.compressed == nil)
        var frame = try #require(event.compressed)
        let first = frame.readInteger(as: UInt8.self)
        #expect(first == 0xC1)
        let second = frame.readInteger(as: UInt8.self)
        let length = Int(try #require(second))
        let extended = length == 126 ? frame.readInteger(as: UInt16.self) : nil
        let payloadLength = extended.map(Int.init) ?? length
        #expect(payloadLength == frame.readableBytes)
        #expect(frame.readableBytes * 3 < json.readableBytes, "a JSON with repeated keys shrinks at least 3 times")
        let inflated = try PerMessageDeflate.inflate(frame, limit: 1 << 20)
        #expect(inflated.readableBytesView.elementsEqual(json.readableBytesView))
    }

    @Test func shortEventsAndEventsThatDoNotShrinkGoUncompressed() {
        let short = Self.jobProgress(bytes: 100)
        #expect(WireEvent(json: short, compression: EventCompression()).compressed == nil)
        var message = Message()
        message.channel = "/r"
        message["data"] = .string((0..<600).map { _ in String(UInt8.random(in: 0...255), radix: 16) }.joined())
        let random = WireEvent(encoding: message, compression: EventCompression(minimumBytes: 0))
        if let frame = random.compressed { #expect(frame.readableBytes < random.frame.readableBytes) }
    }

    /// A decompression bomb stops at the limit: inflating stops there instead of going through the rest.
    @Test func aMessageThatInflatesPastTheLimitIsRefused() throws {
        var zeros = ByteBuffer(repeating: 0x20, count: 8 << 20)
        zeros.writeString("")
        let deflated = try #require(DeflaterPool().deflate(zeros, headroom: 0))
        #expect(deflated.readableBytes < 16 << 10)
        #expect(throws: PerMessageDeflate.InflateError.tooLarge) {
            try PerMessageDeflate.inflate(deflated, limit: 1 << 20)
        }
        let fits = try PerMessageDeflate.inflate(deflated, limit: 8 << 20)
        #expect(fits.readableBytes == 8 << 20)
    }

    /// The limit is exact: one byte over it is refused, whatever room the output buffer rounded up to.
    @Test func theLimitIsExact() throws {
        for size in [65_536, 65_537, 69_632, 100_000] {
            let deflated = try #require(DeflaterPool().deflate(ByteBuffer(repeating: 0x61, count: size), headroom: 0))
            if size <= 65_536 {
                #expect(try PerMessageDeflate.inflate(deflated, limit: 65_536).readableBytes == size)
            } else {
                #expect(throws: PerMessageDeflate.InflateError.tooLarge, "\(size)") {
                    try PerMessageDeflate.inflate(deflated, limit: 65_536)
                }
            }
        }
    }

    @Test func aPayloadThatIsNotDeflateIsCorrupt() {
        #expect(throws: PerMessageDeflate.InflateError.corrupt) {
            try PerMessageDeflate.inflate(ByteBuffer(bytes: [0xFF, 0xFF, 0xFF, 0x12, 0x34]), limit: 1 << 20)
        }
    }
}
