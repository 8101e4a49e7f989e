import Bayeux
import NIOCore
import NIOWebSocket

/// The inbound side of a WebSocket (RFC 6455), as a pure struct: bytes in, whole messages out. Frames are
/// unmasked, and a message split into continuation frames comes out as one frame; control frames (ping, pong,
/// close) come out as they arrive, also between the fragments of a message. What NIO's frame decoder and
/// `NIOWebSocketFrameAggregator` do in two handlers, with their buffers, done in the connection's own handler:
/// an idle WebSocket keeps nothing here (no bytes pending, no fragments) but a few integers.
///
/// Limits, as before: a frame longer than `maxFrameSize`, or a fragmented message longer than
/// `maxMessageSize` or of more than `maxFragments` frames, is an error (answered with close 1009 or 1002).
/// As RFC 6455 §5.1–5.2 require of a server, a client frame that is not masked, or that sets a reserved bit (no
/// extension is ever negotiated), is a protocol error too.
struct WebSocketFrameParser {
    enum ParseError: Error, Equatable {
        /// A frame, or a message of several frames, over the size limit (close code 1009).
        case tooLarge
        /// A control frame fragmented or longer than 125 bytes, a continuation with no message to continue, a new
        /// message before the last one ended, too many fragments, an unmasked client frame or a reserved bit set
        /// (close code 1002).
        case protocolError
    }

    let maxFrameSize: Int
    let maxMessageSize: Int
    let maxFragments: Int
    /// Frames must be masked (a server reading a client); false to read what a server wrote (tests, clients).
    let requiresMask: Bool
    /// Bytes received and not yet parsed (a frame cut by the end of a read); nil when there are none.
    private var pending: ByteBuffer?
    /// The fragments of a message still in progress.
    private var fragments: [ByteBuffer] = []
    private var fragmentsOpcode: WebSocketOpcode = .text
    private var fragmentsSize = 0

    init(maxFrameSize: Int, maxMessageSize: Int? = nil, maxFragments: Int = 4096, requiresMask: Bool = true) {
        self.maxFrameSize = maxFrameSize
        self.maxMessageSize = maxMessageSize ?? maxFrameSize
        self.maxFragments = maxFragments
        self.requiresMask = requiresMask
    }

    /// Whether bytes or fragments wait for more input (for tests).
    var isIdle: Bool { pending == nil && fragments.isEmpty }

    /// The storage held for bytes not yet parsed (for tests).
    var pendingCapacity: Int { pending?.capacity ?? 0 }

    /// Adds bytes read from the socket.
    mutating func append(_ bytes: ByteBuffer) {
        guard bytes.readableBytes > 0 else { return }
        if pending == nil {
            pending = bytes
        } else {
            var bytes = bytes
            pending!.writeBuffer(&bytes)
        }
    }

    /// The next whole message or control frame, or nil when more bytes are needed. After an error the parser
    /// must not be used again (the connection closes).
    mutating func next() throws(ParseError) -> WebSocketFrame? {
        while let frame = try nextFrame() {
            switch frame.opcode {
            case .continuation:
                guard !fragments.isEmpty else { throw .protocolError }
                try addFragment(frame)
                guard frame.fin else { continue }
                return takeMessage()
            case .text, .binary:
                guard fragments.isEmpty else { throw .protocolError }
                if frame.fin { return frame }
                fragmentsOpcode = frame.opcode
                try addFragment(frame)
            default:
                // Control frames, and opcodes this server does not know (the handler ignores those).
                return frame
            }
        }
        return nil
    }

    private mutating func addFragment(_ frame: WebSocketFrame) throws(ParseError) {
        fragmentsSize += frame.data.readableBytes
        guard fragmentsSize <= maxMessageSize else { throw .tooLarge }
        guard fragments.count < maxFragments else { throw .protocolError }
        fragments.append(frame.data)
    }

    private mutating func takeMessage() -> WebSocketFrame {
        var data = ByteBufferAllocator().buffer(capacity: fragmentsSize)
        for var fragment in fragments { data.writeBuffer(&fragment) }
        let opcode = fragmentsOpcode
        fragments = []
        fragmentsSize = 0
        return WebSocketFrame(fin: true, opcode: opcode, data: data)
    }

    /// One frame off `pending`, unmasked; nil when it is not all there yet.
    private mutating func nextFrame() throws(ParseError) -> WebSocketFrame? {
        guard let buffer = pending, buffer.readableBytes >= 2 else { return nil }
        var index = buffer.readerIndex
        let first = buffer.getInteger(at: index, as: UInt8.self)!
        let second = buffer.getInteger(at: index + 1, as: UInt8.self)!
        index += 2
        let fin = first & 0x80 != 0
        guard let opcode = WebSocketOpcode(encodedWebSocketOpcode: first & 0x0F) else { throw .protocolError }
        guard first & 0x70 == 0 else { throw .protocolError }
        let masked = second & 0x80 != 0
        guard masked || !requiresMask else { throw .protocolError }
        var length = Int(second & 0x7F)
        if opcode.isControlOpcode {
            guard fin else { throw .protocolError }
            guard length <= 125 else { throw .protocolError }
        }
        if length == 126 {
            guard let extended = buffer.getInteger(at: index, as: UInt16.self) else { return nil }
            length = Int(extended)
            index += 2
        } else if length == 127 {
            guard let extended = buffer.getInteger(at: index, as: UInt64.self) else { return nil }
            guard extended <= UInt64(maxFrameSize) else { throw .tooLarge }
            length = Int(extended)
            index += 8
        }
        guard length <= maxFrameSize else { throw .tooLarge }
        var maskKey: WebSocketMaskingKey?
        if masked {
            guard let key = buffer.getBytes(at: index, length: 4) else { return nil }
            maskKey = WebSocketMaskingKey(key)
            index += 4
        }
        guard var data = buffer.getSlice(at: index, length: length) else { return nil }
        index += length
        if let maskKey { data.webSocketUnmask(maskKey) }
        if index == buffer.writerIndex {
            pending = nil
        } else {
            pending!.moveReaderIndex(to: index)
            // The frames read so far are dropped from the storage, which would otherwise grow for as long as a
            // client keeps a partial frame pending (a stream of frames that never lines up with the reads).
            if pending!.readerIndex >= 4096 { pending!.discardReadBytes() }
        }
        return WebSocketFrame(fin: fin, opcode: opcode, data: data)
    }
}

/// The outbound side: a frame header (server frames are never masked), written in front of the payload when
/// the payload has room before its reader index, else as a buffer of its own.
enum WebSocketFrameHeader {
    /// Room that payloads built for a WebSocket leave in front, so that their header is written in place.
    static let maxLength = 10

    static func length(ofPayload count: Int) -> Int {
        count <= 125 ? 2 : count <= 0xFFFF ? 4 : 10
    }

    /// Writes the header of a final frame of `opcode` carrying `count` bytes at `index`; returns its length.
    @discardableResult
    static func set(opcode: WebSocketOpcode, payloadLength count: Int, in buffer: inout ByteBuffer, at index: Int) -> Int {
        let first = 0x80 | UInt8(webSocketOpcode: opcode)
        buffer.setInteger(first, at: index)
        if count <= 125 {
            buffer.setInteger(UInt8(count), at: index + 1)
            return 2
        } else if count <= 0xFFFF {
            buffer.setInteger(UInt8(126), at: index + 1)
            buffer.setInteger(UInt16(count), at: index + 2)
            return 4
        } else {
            buffer.setInteger(UInt8(127), at: index + 1)
            buffer.setInteger(UInt64(count), at: index + 2)
            return 10
        }
    }

    /// `payload` with its header in front when it has the room and is not shared; nil otherwise.
    static func prepend(opcode: WebSocketOpcode, to payload: inout ByteBuffer) -> Bool {
        let count = payload.readableBytes
        let needed = length(ofPayload: count)
        guard payload.readerIndex >= needed else { return false }
        let done: Bool? = payload.modifyIfUniquelyOwned { buffer in
            let start = buffer.readerIndex - needed
            set(opcode: opcode, payloadLength: count, in: &buffer, at: start)
            buffer.moveReaderIndex(to: start)
            return true
        }
        return done ?? false
    }

    /// A buffer holding only the header.
    static func buffer(opcode: WebSocketOpcode, payloadLength count: Int, allocator: ByteBufferAllocator) -> ByteBuffer {
        var header = allocator.buffer(capacity: maxLength)
        let written = set(opcode: opcode, payloadLength: count, in: &header, at: 0)
        header.moveWriterIndex(to: written)
        return header
    }

    /// The bytes of one final, unmasked frame: an event shared by every recipient carries its header already
    /// (`EventFrame`, written when it was encoded) and goes as it is; a payload with room in front gets its header
    /// there; any other gets a small header buffer of its own, first (a shared buffer is never written into).
    static func frame(opcode: WebSocketOpcode, payload: ByteBuffer, allocator: ByteBufferAllocator)
        -> (ByteBuffer, ByteBuffer?)
    {
        if opcode == .text, let frame = EventFrame.webSocketFrame(of: payload) { return (frame, nil) }
        var payload = payload
        if prepend(opcode: opcode, to: &payload) { return (payload, nil) }
        let header = buffer(opcode: opcode, payloadLength: payload.readableBytes, allocator: allocator)
        return (header, payload.readableBytes == 0 ? nil : payload)
    }

    /// A close frame's payload, with room for its header: the status code, if any.
    static func closePayload(_ code: WebSocketErrorCode?, allocator: ByteBufferAllocator) -> ByteBuffer {
        var data = allocator.buffer(capacity: 2 + maxLength)
        data.moveWriterIndex(forwardBy: maxLength)
        data.moveReaderIndex(forwardBy: maxLength)
        if let code { data.write(webSocketErrorCode: code) }
        return data
    }
}

extension WebSocketFrameParser {
    static func isValidUTF8(_ buffer: ByteBuffer) -> Bool {
        buffer.withUnsafeReadableBytes { String(validating: $0, as: UTF8.self) != nil }
    }
}

extension ConnectionStateMachine.CloseReason {
    /// The status code of the close frame that ends a WebSocket for this reason.
    var webSocketCode: WebSocketErrorCode {
        switch self {
        case .normal: .normalClosure
        case .goingAway: .goingAway
        case .overflow: .policyViolation
        }
    }
}
