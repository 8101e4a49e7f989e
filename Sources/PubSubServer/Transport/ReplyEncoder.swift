import Bayeux
import NIOCore
import PubSubCore

/// Builds the JSON array a request or frame is answered with: replies first, then events. Events are already
/// encoded as one-element arrays (`WireEvent.json`); their inner bytes are spliced in, never re-encoded.
enum ReplyEncoder {
    /// The reply to a message that is not JSON or not a message: `400::Bad request`.
    static let badRequest: Message = {
        var m = Message()
        m.fail(BayeuxError.badRequest)
        return m
    }()

    /// The reply when the broker failed on a frame.
    static let serverError: Message = {
        var m = Message()
        m.fail(BayeuxError(.serverError))
        return m
    }()

    /// `headroom`: bytes left free before the array (a WebSocket frame header is written there in place).
    static func encode(
        replies: [Message],
        events: CircularBuffer<WireEvent>,
        allocator: ByteBufferAllocator,
        headroom: Int = 0
    ) -> ByteBuffer {
        if replies.isEmpty, events.count == 1, let only = events.first { return only.json }
        var size = 2 + replies.count * 96
        for e in events { size += e.json.readableBytes }
        var buffer = allocator.buffer(capacity: size + headroom)
        if headroom > 0 {
            buffer.moveWriterIndex(forwardBy: headroom)
            buffer.moveReaderIndex(forwardBy: headroom)
        }
        buffer.writeInteger(UInt8(ascii: "["))
        var first = true
        for reply in replies {
            if !first { buffer.writeInteger(UInt8(ascii: ",")) }
            first = false
            buffer.writeJSON(reply.fields)
        }
        for event in events {
            if !first { buffer.writeInteger(UInt8(ascii: ",")) }
            first = false
            var inner = event.json
            inner.moveReaderIndex(forwardBy: 1)
            buffer.writeImmutableBuffer(inner.getSlice(at: inner.readerIndex, length: inner.readableBytes - 1)!)
        }
        buffer.writeInteger(UInt8(ascii: "]"))
        return buffer
    }

    /// Escapes raw U+2028 and U+2029, which old JavaScript does not accept in string literals (JSON-P).
    static func escapeLineSeparators(_ buffer: ByteBuffer, allocator: ByteBufferAllocator) -> ByteBuffer {
        let bytes = buffer.readableBytesView
        guard bytes.contains(0xE2) else { return buffer }
        var out = allocator.buffer(capacity: buffer.readableBytes + 16)
        var i = bytes.startIndex
        while i < bytes.endIndex {
            if bytes[i] == 0xE2, i + 2 < bytes.endIndex, bytes[i + 1] == 0x80,
                bytes[i + 2] == 0xA8 || bytes[i + 2] == 0xA9
            {
                out.writeString(bytes[i + 2] == 0xA8 ? "\\u2028" : "\\u2029")
                i += 3
            } else {
                out.writeInteger(bytes[i])
                i += 1
            }
        }
        return out
    }
}
