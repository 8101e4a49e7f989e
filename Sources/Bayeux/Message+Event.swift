import NIOCore

/// Encode once, write many: a published message is encoded a single time, and the same buffer (copy-on-write, so
/// a retain and not a copy) is queued for every recipient, on every transport and every node.
extension Message {
    /// The bytes every recipient gets: a one-element JSON array, so a single event is a whole frame as it is.
    /// A reply that carries several messages splices the bytes between the brackets, never re-encoding them.
    public func encodedEvent() -> ByteBuffer {
        var buffer = ByteBufferAllocator().buffer(capacity: 128)
        buffer.writeInteger(UInt8(ascii: "["))
        buffer.writeJSON(fields)
        buffer.writeInteger(UInt8(ascii: "]"))
        return buffer
    }
}
