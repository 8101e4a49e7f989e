import NIOCore

/// Encode once, write many: a published message is encoded a single time, and the same buffer (copy-on-write, so
/// a retain and not a copy) is queued for every recipient, on every transport and every node.
extension Message {
    /// The bytes every recipient gets: a one-element JSON array, so a single event is a whole frame as it is.
    /// A reply that carries several messages splices the bytes between the brackets, never re-encoding them.
    ///
    /// Before those bytes, out of sight of every reader (before the reader index), the buffer holds the header
    /// of the WebSocket frame that carries exactly them (`EventFrame`): a WebSocket recipient sends the shared
    /// buffer as one whole frame, with no header of its own to allocate and one write instead of two.
    public func encodedEvent() -> ByteBuffer {
        var buffer = ByteBufferAllocator().buffer(capacity: 128 + EventFrame.headroom)
        buffer.moveWriterIndex(forwardBy: EventFrame.headroom)
        buffer.moveReaderIndex(forwardBy: EventFrame.headroom)
        buffer.writeInteger(UInt8(ascii: "["))
        buffer.writeJSON(fields)
        buffer.writeInteger(UInt8(ascii: "]"))
        EventFrame.writeHeader(before: &buffer)
        return buffer
    }
}
