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
        writeHeader(first: finalText, payloadLength: count, in: &buffer, at: start)
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

/// The permessage-deflate frame of an event (RFC 7692), compressed once per publish and shared by every WebSocket
/// recipient that negotiated it, as the plain frame is by the others. It sits in the event's buffer, before the
/// plain frame's header and out of sight of every reader:
///
///     [compressed frame: header (FIN, RSV1, text) + deflated bytes][its length: UInt32][tag: 16 bytes][header][event]
///
/// The tag is a secret of this process, drawn at start: bytes before an event's reader index that came from
/// elsewhere (a slice of what another node sent) cannot pass for a compressed frame, whatever they hold.
extension EventFrame {
    /// The first byte of a final, compressed text frame: FIN, RSV1 and opcode 1.
    static let compressedText: UInt8 = 0xC1

    private static let tag: (UInt64, UInt64) = (UInt64.random(in: .min ... .max), UInt64.random(in: .min ... .max))

    /// `event` (copied once, with its plain frame header in front, whether or not it had one) and, before it,
    /// the compressed frame whose payload is `deflated`: the event's bytes compressed with DEFLATE, the final
    /// `00 00 ff ff` of the sync flush removed. One copy of the event, once per publish.
    public static func withCompressedFrame(_ event: ByteBuffer, deflated: ByteBuffer) -> ByteBuffer {
        let count = event.readableBytes
        let compressedHeader = headerLength(ofPayload: deflated.readableBytes)
        let frameLength = compressedHeader + deflated.readableBytes
        var buffer = ByteBufferAllocator().buffer(capacity: frameLength + 20 + headroom + count)
        buffer.moveWriterIndex(forwardBy: compressedHeader)
        buffer.writeImmutableBuffer(deflated)
        writeHeader(first: compressedText, payloadLength: deflated.readableBytes, in: &buffer, at: 0)
        buffer.writeInteger(UInt32(frameLength))
        buffer.writeInteger(tag.0)
        buffer.writeInteger(tag.1)
        buffer.moveWriterIndex(forwardBy: headerLength(ofPayload: count))
        buffer.moveReaderIndex(to: buffer.writerIndex)
        buffer.writeImmutableBuffer(event)
        writeHeader(before: &buffer)
        return buffer
    }

    /// The compressed frame `withCompressedFrame` put before `event`, sharing its storage; nil when there is none
    /// (compression off, an event under the minimum size, or one that did not shrink).
    public static func compressedFrame(of event: ByteBuffer) -> ByteBuffer? {
        guard webSocketFrame(of: event) != nil else { return nil }
        let tagEnd = event.readerIndex - headerLength(ofPayload: event.readableBytes)
        guard tagEnd >= 20 else { return nil }
        // What lies before the reader index is read through a copy whose reader index is moved back to it.
        var frame = event
        frame.moveReaderIndex(to: tagEnd - 20)
        guard frame.getInteger(at: tagEnd - 16, as: UInt64.self) == tag.0,
            frame.getInteger(at: tagEnd - 8, as: UInt64.self) == tag.1,
            let length = frame.getInteger(at: tagEnd - 20, as: UInt32.self).map(Int.init),
            tagEnd - 20 - length >= 0
        else { return nil }
        frame.moveReaderIndex(to: tagEnd - 20 - length)
        frame.moveWriterIndex(to: tagEnd - 20)
        return frame
    }

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
