import Bayeux
import NIOCore

/// One published event as the transports write it, made once per publish (or once per event read from another
/// node) and shared by every recipient on this node: a queue holds a reference to it, never a copy.
///
/// It says what it carries, as swift-nio's frame types do: the Bayeux JSON every transport splices into its
/// replies, the WebSocket text frame of exactly that JSON (RFC 6455 §5.2, final and unmasked, as a server's
/// frames are), and the permessage-deflate frame of it (RFC 7692) when compression is on and the event shrank.
/// The three share one storage where they can: the frame is the JSON with its header in front, written once, so a
/// broadcast to WebSocket recipients costs neither a header buffer nor a second write per recipient.
///
/// Two events are equal when their JSON is (an event's position is in its JSON): a resume's range, read again
/// from history, is recognised in a queue that already holds some of it.
public final class WireEvent: Sendable, Hashable, CustomStringConvertible {
    /// The event as Bayeux JSON: a one-element array, `[{…}]`.
    public let json: ByteBuffer
    /// `json` as one final, unmasked WebSocket text frame: header, then payload.
    public let frame: ByteBuffer
    /// `json` as one final, compressed WebSocket text frame (FIN, RSV1, text; the deflated bytes without the sync
    /// flush's trailing `00 00 ff ff`); nil when compression is off, the event is under its minimum size, or it
    /// did not shrink.
    public let compressed: ByteBuffer?

    /// The most bytes a frame header takes (a 64-bit length).
    public static let headroom = 10

    /// `message` encoded once, with its frame (and compressed frame, with `compression`).
    public convenience init(encoding message: Message, compression: EventCompression? = nil) {
        var buffer = ByteBufferAllocator().buffer(capacity: 128 + Self.headroom)
        buffer.moveWriterIndex(forwardBy: Self.headroom)
        buffer.moveReaderIndex(forwardBy: Self.headroom)
        buffer.writeInteger(UInt8(ascii: "["))
        buffer.writeJSON(message.fields)
        buffer.writeInteger(UInt8(ascii: "]"))
        self.init(roomyJSON: Self.trimmed(consume buffer), compression: compression)
    }

    /// Bytes encoded elsewhere (another node's event, read from Redis): copied once, behind room for the header.
    public convenience init(json bytes: ByteBuffer, compression: EventCompression? = nil) {
        var buffer = ByteBufferAllocator().buffer(capacity: Self.headroom + bytes.readableBytes)
        buffer.moveWriterIndex(forwardBy: Self.headroom)
        buffer.moveReaderIndex(forwardBy: Self.headroom)
        buffer.writeImmutableBuffer(bytes)
        self.init(roomyJSON: consume buffer, compression: compression)
    }

    /// `buffer` itself, or a copy of it that holds no more than it uses: a large event encoded in a buffer that
    /// grew by doubling would keep up to twice its size, in every queue and in the history, whose bound counts
    /// the bytes of the JSON. Its headroom is kept.
    static func trimmed(_ buffer: consuming ByteBuffer) -> ByteBuffer {
        guard buffer.capacity - buffer.writerIndex > 1024 else { return buffer }
        var copy = ByteBufferAllocator().buffer(capacity: buffer.writerIndex)
        copy.moveWriterIndex(forwardBy: buffer.readerIndex)
        copy.moveReaderIndex(forwardBy: buffer.readerIndex)
        copy.writeImmutableBuffer(buffer)
        return copy
    }

    /// `buffer` has `headroom` free bytes before its reader index, and nothing else will write into it. It is
    /// taken, not copied: the header is written into its own storage (a copy still held here would make that
    /// write copy the whole event).
    private init(roomyJSON buffer: consuming ByteBuffer, compression: EventCompression?) {
        var frame = buffer
        let count = frame.readableBytes
        let jsonStart = frame.readerIndex
        let start = jsonStart - Self.headerLength(ofPayload: count)
        Self.writeHeader(first: Self.finalText, payloadLength: count, in: &frame, at: start)
        frame.moveReaderIndex(to: start)
        let json = frame.getSlice(at: jsonStart, length: count)!
        self.json = json
        self.frame = frame
        self.compressed = compression.flatMap { $0.compressedFrame(of: json) }
    }

    public static func == (lhs: WireEvent, rhs: WireEvent) -> Bool {
        lhs === rhs || lhs.json == rhs.json
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(json) }

    public var description: String { String(buffer: json) }

    /// The channel of an event that carries a position (`ext.position`), read from its JSON; nil for one without
    /// (published with no history, or while Redis was away). Only a resume asks (`MemoryEngine.placeRange`).
    package var positionedChannel: String? {
        guard let message = try? JSONParser().parse(json).arrayValue?.first?.objectValue,
            message["ext"]?.objectValue?["position"]?.stringValue != nil
        else { return nil }
        return message["channel"]?.stringValue
    }

    /// The length of the header of a frame carrying `count` bytes.
    static func headerLength(ofPayload count: Int) -> Int {
        count <= 125 ? 2 : count <= 0xFFFF ? 4 : 10
    }

    /// The first byte of a final text frame: FIN and opcode 1.
    static let finalText: UInt8 = 0x81
    /// The first byte of a final, compressed text frame: FIN, RSV1 and opcode 1.
    static let compressedText: UInt8 = 0xC1

    static func writeHeader(first: UInt8, payloadLength count: Int, in buffer: inout ByteBuffer, at start: Int) {
        buffer.setInteger(first, at: start)
        if count <= 125 {
            buffer.setInteger(UInt8(count), at: start + 1)
        } else if count <= 0xFFFF {
            buffer.setInteger(UInt8(126), at: start + 1)
            buffer.setInteger(UInt16(count), at: start + 2)
        } else {
            buffer.setInteger(UInt8(127), at: start + 1)
            buffer.setInteger(UInt64(count), at: start + 2)
        }
    }
}
