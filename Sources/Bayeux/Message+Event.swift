import NIOCore

/// Encode once, write many: a published message is encoded a single time (`WireEvent` in the engine wraps these
/// bytes with the frames the transports write), and the same buffer is queued for every recipient.
extension Message {
    /// The bytes every recipient gets: a one-element JSON array, so a single event is a whole reply as it is.
    /// A reply that carries several messages splices the bytes between the brackets, never re-encoding them.
    public func encodedEvent() -> ByteBuffer {
        var buffer = ByteBufferAllocator().buffer(capacity: 128)
        buffer.writeInteger(UInt8(ascii: "["))
        buffer.writeJSON(fields)
        buffer.writeInteger(UInt8(ascii: "]"))
        return buffer
    }
}
