import Bayeux
import NIOCore
import NIOPosix
import NIOWebSocket

/// The inbound side of a WebSocket (RFC 6455), as a pure struct: bytes in, whole messages out. Frames are
/// unmasked, and a message split into continuation frames comes out as one frame; control frames (ping, pong,
/// close) come out as they arrive, also between the fragments of a message. What NIO's frame decoder and
/// `NIOWebSocketFrameAggregator` do in two handlers, with their buffers, done in the connection's own handler:
/// an idle WebSocket keeps nothing here (no bytes pending, no fragments) but a few integers.
///
/// Limits, as before: a frame longer than `maxFrameSize`, or a fragmented message longer than
/// `maxMessageSize` or of more than `maxFragments` frames, is an error (answered with close 1009 or 1002).
/// What RFC 6455 says a server MUST fail the connection for is an error too: a client frame that is not masked
/// (§5.1), that sets a reserved bit no extension allows or has a reserved opcode (§5.2), a close frame whose body
/// is not a status code a peer may send followed by a UTF-8 reason (§5.5.1, §7.4), and text that is not UTF-8,
/// found in the fragment that holds it (§8.1). A text message of one frame is not read twice for that: the
/// handler's JSON parser checks its UTF-8 as it reads it.
struct WebSocketFrameParser {
    enum ParseError: Error, Equatable {
        /// A frame, or a message of several frames, over the size limit (close code 1009).
        case tooLarge
        /// A control frame fragmented or longer than 125 bytes, a continuation with no message to continue, a new
        /// message before the last one ended, too many fragments, an unmasked client frame, a reserved bit set, a
        /// reserved opcode, or a close body that is one byte, an invalid status code or a reason that is not UTF-8
        /// (close code 1002).
        case protocolError
        /// A fragment of a text message that is not UTF-8, or a text message that ends inside a character (close
        /// code 1007).
        case invalidUTF8
        /// A compressed message (permessage-deflate) that does not inflate (close code 1007). Raised by the
        /// handler, which inflates; a message that inflates past the limit is `tooLarge`.
        case corruptCompression
    }

    /// A frame, or a whole message, as the parser gives it out: its fields inline (NIO's `WebSocketFrame` keeps
    /// them in a class of its own, an allocation per frame).
    struct Frame {
        var fin: Bool
        var rsv1: Bool
        var opcode: WebSocketOpcode
        var data: ByteBuffer
    }

    /// The limits, kept as 32-bit numbers (every open WebSocket has a parser: 12 bytes instead of 24).
    private let limits: (frame: UInt32, message: UInt32, fragments: UInt32)
    var maxFrameSize: Int { Int(limits.frame) }
    var maxMessageSize: Int { Int(limits.message) }
    var maxFragments: Int { Int(limits.fragments) }
    /// Frames must be masked (a server reading a client); false to read what a server wrote (tests, clients).
    let requiresMask: Bool
    /// permessage-deflate was negotiated: the first frame of a message may set RSV1 (the message is compressed;
    /// it comes out with `rsv1` set, to be inflated, and its text is checked once inflated, not here).
    let compressed: Bool
    /// Bytes received and not yet parsed (a frame cut by the end of a read); nil when there are none.
    private var pending: ByteBuffer?
    /// The fragments of a message still in progress.
    private var fragments: [ByteBuffer] = []
    private var fragmentsOpcode: WebSocketOpcode = .text
    private var fragmentsSize = 0
    private var fragmentsCompressed = false
    /// Where the text of a fragmented text message stands: three bytes, not a buffer.
    private var fragmentsText = UTF8Validator()

    init(
        maxFrameSize: Int, maxMessageSize: Int? = nil, maxFragments: Int = 4096, requiresMask: Bool = true,
        compressed: Bool = false
    ) {
        func clamped(_ value: Int) -> UInt32 { UInt32(clamping: max(0, value)) }
        self.limits = (clamped(maxFrameSize), clamped(maxMessageSize ?? maxFrameSize), clamped(maxFragments))
        self.requiresMask = requiresMask
        self.compressed = compressed
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
    mutating func next() throws(ParseError) -> Frame? {
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
                fragmentsCompressed = frame.rsv1
                try addFragment(frame)
            case .connectionClose:
                guard Self.isValidCloseBody(frame.data) else { throw .protocolError }
                return frame
            default:
                // Ping and pong (`nextFrame` refuses reserved opcodes).
                return frame
            }
        }
        return nil
    }

    private mutating func addFragment(_ frame: Frame) throws(ParseError) {
        fragmentsSize += frame.data.readableBytes
        guard fragmentsSize <= maxMessageSize else { throw .tooLarge }
        guard fragments.count < maxFragments else { throw .protocolError }
        if fragmentsOpcode == .text, !fragmentsCompressed {
            // §8.1: failed as soon as the bytes are in, not when the message ends; a character may be split
            // between fragments, but not left unfinished by the last one.
            guard fragmentsText.validate(frame.data), !frame.fin || fragmentsText.isComplete else {
                throw .invalidUTF8
            }
        }
        // Not a view of the thread's `UnmaskBuffer`, which the next frame reuses.
        var copy = ByteBufferAllocator().buffer(capacity: frame.data.readableBytes)
        copy.writeImmutableBuffer(frame.data)
        fragments.append(copy)
    }

    private mutating func takeMessage() -> Frame {
        var data = ByteBufferAllocator().buffer(capacity: fragmentsSize)
        for var fragment in fragments { data.writeBuffer(&fragment) }
        let (opcode, rsv1) = (fragmentsOpcode, fragmentsCompressed)
        fragments = []
        fragmentsSize = 0
        fragmentsCompressed = false
        fragmentsText = UTF8Validator()
        return Frame(fin: true, rsv1: rsv1, opcode: opcode, data: data)
    }

    /// A frame's header: where its payload is and how to unmask it.
    private struct Header {
        var fin: Bool
        var rsv1: Bool
        var opcode: WebSocketOpcode
        /// The masking key's four bytes, first byte highest; nil for an unmasked frame.
        var mask: UInt32?
        /// The payload's index in `pending` and its length.
        var payload: Int
        var length: Int
    }

    /// One frame off `pending`, unmasked; nil when it is not all there yet. The payload is unmasked in
    /// `pending`'s own storage and sliced from it when `pending` owns it: no copy per frame, and the key is read
    /// as one integer (NIO's `WebSocketMaskingKey` from a view of four bytes cost four allocations, its unmask of a
    /// slice a copy). The storage of a read is shared while the pipeline handles it (NIO's read loop holds it
    /// too), and unmasking there would copy the whole read: a frame of up to `UnmaskBuffer.limit` bytes is
    /// unmasked into this thread's `UnmaskBuffer` instead, reused frame after frame.
    private mutating func nextFrame() throws(ParseError) -> Frame? {
        guard pending != nil, let header = try header(of: pending!) else { return nil }
        var data: ByteBuffer
        if let mask = header.mask, header.length > 0 {
            let offset = header.payload - pending!.readerIndex
            let length = header.length
            let owned = pending!.modifyIfUniquelyOwned { _ in true } ?? false
            if owned || length > UnmaskBuffer.limit {
                // In place: nothing else holds the storage, or the frame is too large for the shared buffer (the
                // write then copies the read, once).
                pending!.withUnsafeMutableReadableBytes { bytes in
                    Self.unmask(
                        UnsafeRawBufferPointer(bytes), from: offset, length: length, mask, into: bytes, at: offset)
                }
                data = pending!.getSlice(at: header.payload, length: length)!
            } else {
                let shared = UnmaskBuffer.current
                shared.bytes.clear(minimumCapacity: length)
                _ = pending!.withUnsafeReadableBytes { source in
                    shared.bytes.writeWithUnsafeMutableBytes(minimumWritableBytes: length) { target in
                        Self.unmask(source, from: offset, length: length, mask, into: target, at: 0)
                        return length
                    }
                }
                data = shared.bytes
            }
        } else {
            data = pending!.getSlice(at: header.payload, length: header.length)!
        }
        let end = header.payload + header.length
        if end == pending!.writerIndex {
            pending = nil
        } else {
            pending!.moveReaderIndex(to: end)
            // The frames read so far are dropped from the storage, which would otherwise grow for as long as a
            // client keeps a partial frame pending (a stream of frames that never lines up with the reads).
            if pending!.readerIndex >= 4096 { pending!.discardReadBytes() }
        }
        return Frame(fin: header.fin, rsv1: header.rsv1, opcode: header.opcode, data: data)
    }

    /// `length` bytes of `source` from `from`, unmasked with `mask` (its first byte highest), into `target` at
    /// `at` (which may be the same bytes).
    private static func unmask(
        _ source: UnsafeRawBufferPointer, from: Int, length: Int, _ mask: UInt32,
        into target: UnsafeMutableRawBufferPointer,
        at: Int
    ) {
        let key = (
            UInt8(truncatingIfNeeded: mask >> 24), UInt8(truncatingIfNeeded: mask >> 16),
            UInt8(truncatingIfNeeded: mask >> 8), UInt8(truncatingIfNeeded: mask)
        )
        var i = 0
        while i < length {
            let k: UInt8
            switch i & 3 {
            case 0: k = key.0
            case 1: k = key.1
            case 2: k = key.2
            default: k = key.3
            }
            target[at + i] = source[from + i] ^ k
            i += 1
        }
    }

    /// The header of the frame at the start of `buffer`, once the whole frame is there; nil before.
    private func header(of buffer: ByteBuffer) throws(ParseError) -> Header? {
        guard buffer.readableBytes >= 2 else { return nil }
        var index = buffer.readerIndex
        let first = buffer.getInteger(at: index, as: UInt8.self)!
        let second = buffer.getInteger(at: index + 1, as: UInt8.self)!
        index += 2
        let fin = first & 0x80 != 0
        guard let opcode = Self.definedOpcode(first & 0x0F) else { throw .protocolError }
        guard Self.reservedBitsAllowed(first, opcode: opcode, compressed: compressed) else { throw .protocolError }
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
        var mask: UInt32?
        if masked {
            guard let key = buffer.getInteger(at: index, as: UInt32.self) else { return nil }
            mask = key
            index += 4
        }
        guard buffer.writerIndex - index >= length else { return nil }
        return Header(fin: fin, rsv1: first & 0x40 != 0, opcode: opcode, mask: mask, payload: index, length: length)
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
    static func set(opcode: WebSocketOpcode, payloadLength count: Int, in buffer: inout ByteBuffer, at index: Int)
        -> Int
    {
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
    static func buffer(opcode: WebSocketOpcode, payloadLength count: Int, allocator: ByteBufferAllocator) -> ByteBuffer
    {
        var header = allocator.buffer(capacity: maxLength)
        let written = set(opcode: opcode, payloadLength: count, in: &header, at: 0)
        header.moveWriterIndex(to: written)
        return header
    }

    /// The bytes of one final, unmasked frame: a payload with room in front gets its header there; any other gets
    /// a small header buffer of its own, first (a shared buffer is never written into). An event shared by every
    /// recipient is not framed here: its `WireEvent.frame` goes as it is.
    static func frame(opcode: WebSocketOpcode, payload: consuming ByteBuffer, allocator: ByteBufferAllocator)
        -> (ByteBuffer, ByteBuffer?)
    {
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
    /// The opcodes of RFC 6455 §5.2; nil for the reserved ones (3–7, 0xB–0xF), which fail the connection.
    static func definedOpcode(_ bits: UInt8) -> WebSocketOpcode? {
        switch bits {
        case 0x0...0x2, 0x8...0xA: WebSocketOpcode(encodedWebSocketOpcode: bits)
        default: nil
        }
    }

    /// Whether the reserved bits (RSV1–3) of a frame's first byte are the ones the negotiated extensions allow
    /// (RFC 6455 §5.2): none, but RSV1 on the first frame of a data message once permessage-deflate is
    /// (RFC 7692 §6: never on a control frame or a continuation).
    static func reservedBitsAllowed(_ first: UInt8, opcode: WebSocketOpcode, compressed: Bool = false) -> Bool {
        let allowed: UInt8 = compressed && (opcode == .text || opcode == .binary) ? 0x40 : 0
        return first & 0x70 & ~allowed == 0
    }

    /// A close frame's body (RFC 6455 §5.5.1): empty, or a status code a peer may send, then a UTF-8 reason. A
    /// body of one byte is neither.
    static func isValidCloseBody(_ body: ByteBuffer) -> Bool {
        guard body.readableBytes != 0 else { return true }
        guard let code = body.getInteger(at: body.readerIndex, as: UInt16.self), isValidCloseCode(code) else {
            return false
        }
        var reason = UTF8Validator()
        return reason.validate(body.getSlice(at: body.readerIndex + 2, length: body.readableBytes - 2)!)
            && reason.isComplete
    }

    /// The status codes a peer may put in a close frame (RFC 6455 §7.4). 1012 (service restart), 1013 (try again
    /// later) and 1014 (bad gateway) came after the RFC, in the IANA registry that §11.7 set up for 1000–2999:
    /// they are accepted, since proxies and servers that restart or shed load send them and refusing them would
    /// fail a connection its peer closed correctly (Python's `websockets` accepts them too, and the Autobahn
    /// suite no longer counts them as invalid). 1015 stays refused with 1005 and 1006: the RFC says those are
    /// never sent in a close frame.
    static func isValidCloseCode(_ code: UInt16) -> Bool {
        switch code {
        case 1000...1003, 1007...1011: true  // §7.4.1 (1004 is reserved)
        case 1012...1014: true  // registered with IANA since
        case 3000...4999: true  // §7.4.2: libraries, frameworks and applications (3000–3999), private use
        default: false  // 0–999 unused; 1004, 1005, 1006, 1015; 1016–2999 reserved; 5000 and over undefined
        }
    }

    static func isValidUTF8(_ buffer: ByteBuffer) -> Bool {
        buffer.withUnsafeReadableBytes { String(validating: $0, as: UTF8.self) != nil }
    }
}

/// UTF-8 read in pieces that may split a character (RFC 3629, as Unicode's table 3-7 of well-formed byte
/// sequences has it: no overlong forms, no surrogates, nothing past U+10FFFF). Rather than the bytes of an
/// unfinished character it keeps what they allow next: how many continuation bytes are still due and the range
/// of the next one, so a split character costs no storage.
struct UTF8Validator {
    /// Continuation bytes still due for the character begun.
    private var due: UInt8 = 0
    /// The range of the next continuation byte (narrower than 0x80–0xBF after E0, ED, F0 and F4).
    private var lower: UInt8 = 0x80
    private var upper: UInt8 = 0xBF

    /// Whether the bytes so far end between characters.
    var isComplete: Bool { due == 0 }

    /// Takes the next bytes; false when they cannot be the continuation of UTF-8 (the validator is then spent).
    mutating func validate(_ buffer: ByteBuffer) -> Bool {
        buffer.withUnsafeReadableBytes { validate($0) }
    }

    mutating func validate(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        let count = bytes.count
        while index < count {
            if due == 0 {
                // ASCII eight bytes at a time.
                while index + 8 <= count,
                    bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self) & 0x8080_8080_8080_8080 == 0
                {
                    index += 8
                }
                guard index < count else { break }
            }
            let byte = bytes[index]
            index += 1
            if due > 0 {
                guard byte >= lower, byte <= upper else { return false }
                due -= 1
                lower = 0x80
                upper = 0xBF
                continue
            }
            switch byte {
            case 0x00...0x7F: continue
            case 0xC2...0xDF: due = 1
            case 0xE0: (due, lower) = (2, 0xA0)  // no overlong forms
            case 0xE1...0xEC, 0xEE...0xEF: due = 2
            case 0xED: (due, upper) = (2, 0x9F)  // no surrogates
            case 0xF0: (due, lower) = (3, 0x90)  // no overlong forms
            case 0xF1...0xF3: due = 3
            case 0xF4: (due, upper) = (3, 0x8F)  // nothing past U+10FFFF
            default: return false  // a continuation byte with no lead, C0, C1, F5–FF
            }
        }
        return true
    }
}

extension ConnectionStateMachine.CloseReason {
    /// The status code of the close frame that ends a WebSocket for this reason (none: an empty close frame).
    var webSocketCode: WebSocketErrorCode? {
        switch self {
        case .normal: .normalClosure
        case .goingAway: .goingAway
        case .overflow: .policyViolation
        case .peerClosed(let code): code.map { WebSocketErrorCode(codeNumber: Int($0)) }
        case .protocolError: .protocolError
        case .tooLarge: .messageTooLarge
        case .invalidData: .dataInconsistentWithMessage
        }
    }
}

/// Where a frame is unmasked when the read it came in is still shared: one buffer per thread, reused frame after
/// frame (a frame's bytes are parsed before the next frame is taken; one that must outlive that, a fragment or a
/// pong's payload, is copied or makes the next frame take a fresh buffer). Frames over `limit` are unmasked in a
/// copy of their read instead, so that no thread keeps more than `limit` here.
// @unchecked: thread-bound rather than loop-bound: each thread has its own (a `ThreadSpecificVariable`, which is
// Sendable only for a Sendable value), and it is only ever inside that thread's parse of one frame.
final class UnmaskBuffer: @unchecked Sendable {
    static let limit = 64 * 1024
    var bytes = ByteBuffer()

    private static let perThread = ThreadSpecificVariable<UnmaskBuffer>()

    static var current: UnmaskBuffer {
        if let buffer = perThread.currentValue { return buffer }
        let buffer = UnmaskBuffer()
        perThread.currentValue = buffer
        return buffer
    }
}
