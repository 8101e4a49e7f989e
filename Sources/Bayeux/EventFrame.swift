import NIOCore

/// The WebSocket frame of an encoded event (`Message.encodedEvent()`), written once when the event is encoded:
/// the header of a final, unmasked text frame (RFC 6455 §5.2; a server's frames are never masked) sits just
/// before the event's readable bytes, in room no reader sees. Every WebSocket recipient then writes the same
/// buffer, header included, as one frame: no header buffer of its own and one write instead of two, the cost
/// that would otherwise be paid once per recipient of a broadcast.
///
/// Long-polling and the other transports read the event as they always did: the header is outside the
/// readable bytes. Bytes that did not come from `encodedEvent()` (an event read from another node) have no
/// header there, and their recipients frame them as any other payload.
public enum EventFrame {
    /// The room left in front of an encoded event: the longest header (a 64-bit length).
    public static let headroom = 10

    /// The length of the header of a frame carrying `count` bytes.
    @inlinable
    public static func headerLength(ofPayload count: Int) -> Int {
        count <= 125 ? 2 : count <= 0xFFFF ? 4 : 10
    }

    /// The first byte of a final text frame: FIN and opcode 1.
    @usableFromInline
    static let finalText: UInt8 = 0x81

    /// Writes the header of a final text frame carrying the readable bytes of `buffer` just before them; the
    /// buffer has `headroom` bytes before its reader index.
    static func writeHeader(before buffer: inout ByteBuffer) {
        let count = buffer.readableBytes
        let start = buffer.readerIndex - headerLength(ofPayload: count)
        precondition(start >= 0, "an encoded event has room for its frame header")
        buffer.setInteger(finalText, at: start)
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

    /// `event` as every recipient can share it: as it is when its frame header is in front already, else copied
    /// once into a buffer that has it (an event read from another node), so that its WebSocket recipients do
    /// not each allocate a header and write twice.
    public static func framed(_ event: ByteBuffer) -> ByteBuffer {
        if webSocketFrame(of: event) != nil { return event }
        var buffer = ByteBufferAllocator().buffer(capacity: headroom + event.readableBytes)
        buffer.moveWriterIndex(forwardBy: headroom)
        buffer.moveReaderIndex(forwardBy: headroom)
        buffer.writeImmutableBuffer(event)
        writeHeader(before: &buffer)
        return buffer
    }

    /// The whole WebSocket text frame of `event` (header then payload, sharing the event's storage) when the
    /// bytes just before its readable bytes are exactly the header that frame needs; nil otherwise. The check
    /// is of the bytes themselves, so whatever wrote them, the frame returned is the right one.
    @inlinable
    public static func webSocketFrame(of event: ByteBuffer) -> ByteBuffer? {
        let count = event.readableBytes
        let length = headerLength(ofPayload: count)
        guard event.readerIndex >= length else { return nil }
        var frame = event
        frame.moveReaderIndex(to: event.readerIndex - length)
        let start = frame.readerIndex
        guard frame.getInteger(at: start, as: UInt8.self) == finalText else { return nil }
        switch length {
        case 2:
            guard frame.getInteger(at: start + 1, as: UInt8.self) == UInt8(count) else { return nil }
        case 4:
            guard frame.getInteger(at: start + 1, as: UInt8.self) == 126,
                frame.getInteger(at: start + 2, as: UInt16.self) == UInt16(count)
            else { return nil }
        default:
            guard frame.getInteger(at: start + 1, as: UInt8.self) == 127,
                frame.getInteger(at: start + 2, as: UInt64.self) == UInt64(count)
            else { return nil }
        }
        return frame
    }
}
