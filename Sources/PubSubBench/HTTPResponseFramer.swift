import NIOCore

/// Cuts HTTP/1.1 responses out of the bytes of one client connection, for the long-polling load generator:
/// the status line, the three headers that frame a body (`Content-Length`, `Transfer-Encoding: chunked`,
/// `Connection`), then the body, which is handed on as a slice of the bytes read (no copy when a response
/// arrives in one read, as a long-poll reply almost always does). Other headers are skipped unread.
///
/// A body without length and not chunked runs to the end of the connection (`end()`); `1xx` interim responses
/// are skipped; `204` and `304` have no body. Heads past `maxHeadBytes` and bodies past `maxBodyBytes` fail.
struct HTTPResponseFramer {
    struct Response: Equatable {
        var status: Int
        var body: ByteBuffer
        /// False when the server said it closes the connection after this response.
        var keepAlive: Bool
    }

    struct Failure: Error, Equatable, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    private struct Head {
        var status: Int
        var keepAlive: Bool
    }

    private enum State {
        case head
        case body(Head, remaining: Int)
        case chunkSize(Head, body: ByteBuffer)
        case chunkData(Head, body: ByteBuffer, remaining: Int)
        case chunkDataEnd(Head, body: ByteBuffer)
        case trailers(Head, body: ByteBuffer)
        case untilClose(Head)
        case failed
    }

    let maxHeadBytes: Int
    let maxBodyBytes: Int
    private static let empty = ByteBuffer()
    private var buffer = HTTPResponseFramer.empty
    private var state = State.head

    init(maxHeadBytes: Int = 16 * 1024, maxBodyBytes: Int = 64 * 1024 * 1024) {
        self.maxHeadBytes = maxHeadBytes
        self.maxBodyBytes = maxBodyBytes
    }

    /// True once a byte of a response not yet complete has arrived.
    var isMidResponse: Bool {
        if case .head = state { return buffer.readableBytes > 0 }
        return true
    }

    /// Appends bytes read from the connection.
    mutating func feed(_ bytes: ByteBuffer) {
        if buffer.readableBytes == 0 {
            buffer = bytes  // the common case: no copy
        } else {
            var bytes = bytes
            buffer.writeBuffer(&bytes)
        }
    }

    /// The next complete response, or nil when more bytes are needed. Call until nil after each `feed`.
    mutating func next() throws(Failure) -> Response? {
        while true {
            switch state {
            case .failed:
                throw Failure("response framing failed earlier")
            case .head:
                guard let fields = try readHead() else { return nil }
                guard let fields else { continue }  // a 1xx interim response
                if let response = try startBody(fields) { return response }
            case .body(let head, let remaining):
                guard buffer.readableBytes >= remaining else { return nil }
                let body = buffer.readSlice(length: remaining)!
                return finish(head, body)
            case .chunkSize(let head, let body):
                guard let line = try readLine() else { return nil }
                let size = try chunkSize(line)
                if size == 0 {
                    state = .trailers(head, body: body)
                } else {
                    guard body.readableBytes + size <= maxBodyBytes else { throw fail("response body too large") }
                    state = .chunkData(head, body: body, remaining: size)
                }
            case .chunkData(let head, var body, let remaining):
                guard buffer.readableBytes > 0 else { return nil }
                let n = min(remaining, buffer.readableBytes)
                var part = buffer.readSlice(length: n)!
                state = .failed  // drops the state's reference to `body` while appending
                if body.readableBytes == 0 { body = part } else { body.writeBuffer(&part) }
                state =
                    n == remaining
                    ? .chunkDataEnd(head, body: body) : .chunkData(head, body: body, remaining: remaining - n)
            case .chunkDataEnd(let head, let body):
                guard let line = try readLine() else { return nil }
                guard line.readableBytes == 0 else { throw fail("chunk not followed by CRLF") }
                state = .chunkSize(head, body: body)
            case .trailers(let head, let body):
                guard let line = try readLine() else { return nil }
                if line.readableBytes == 0 { return finish(head, body) }
            case .untilClose:
                guard buffer.readableBytes <= maxBodyBytes else { throw fail("response body too large") }
                return nil
            }
        }
    }

    /// The connection ended: the response whose body runs to the end, if one was being read. Fails when the
    /// connection ended inside a response framed otherwise.
    mutating func end() throws(Failure) -> Response? {
        switch state {
        case .untilClose(let head):
            let body = buffer.readSlice(length: buffer.readableBytes)!
            return finish(head, body)
        case .head where buffer.readableBytes == 0:
            return nil
        case .failed:
            return nil
        default:
            throw fail("connection closed inside a response")
        }
    }

    // MARK: Parts

    private mutating func finish(_ head: Head, _ body: ByteBuffer) -> Response {
        state = .head
        if buffer.readableBytes == 0 { buffer = Self.empty }  // releases the bytes read
        return Response(status: head.status, body: body, keepAlive: head.keepAlive)
    }

    private mutating func fail(_ reason: String) -> Failure {
        state = .failed
        return Failure(reason)
    }

    /// One line up to CRLF (not included), or nil when the line is not complete yet.
    private mutating func readLine() throws(Failure) -> ByteBuffer? {
        let found: Int? = buffer.withUnsafeReadableBytes { bytes in
            var i = 0
            while i + 1 < bytes.count {
                if bytes[i] == 0x0D, bytes[i + 1] == 0x0A { return i }
                i += 1
            }
            return nil
        }
        guard let found else {
            guard buffer.readableBytes <= maxHeadBytes else { throw fail("line too long") }
            return nil
        }
        let line = buffer.readSlice(length: found)!
        buffer.moveReaderIndex(forwardBy: 2)
        return line
    }

    private mutating func chunkSize(_ line: ByteBuffer) throws(Failure) -> Int {
        let parsed: Int? = line.withUnsafeReadableBytes { bytes in
            var value = 0
            var digits = 0
            for c in bytes {
                let d: Int
                switch c {
                case 0x30...0x39: d = Int(c - 0x30)
                case 0x41...0x46: d = Int(c - 0x41 + 10)
                case 0x61...0x66: d = Int(c - 0x61 + 10)
                case UInt8(ascii: ";"), UInt8(ascii: " "), UInt8(ascii: "\t"): return digits > 0 ? value : nil
                default: return nil
                }
                guard digits < 15 else { return nil }
                value = value * 16 + d
                digits += 1
            }
            return digits > 0 ? value : nil
        }
        guard let parsed else {
            state = .failed
            throw Failure("bad chunk size \"\(String(buffer: line).prefix(40))\"")
        }
        return parsed
    }

    /// Reads a complete head: nil when more bytes are needed, `.some(nil)` for a skipped 1xx response.
    private mutating func readHead() throws(Failure) -> HeadFields?? {
        let end: Int? = buffer.withUnsafeReadableBytes { bytes in
            var i = 0
            while i + 3 < bytes.count {
                if bytes[i + 3] == 0x0A, bytes[i + 2] == 0x0D, bytes[i + 1] == 0x0A, bytes[i] == 0x0D { return i + 4 }
                i += 1
            }
            return nil
        }
        guard let end else {
            guard buffer.readableBytes <= maxHeadBytes else { throw fail("response head too large") }
            return nil
        }
        guard end <= maxHeadBytes else { throw fail("response head too large") }
        let parsed = buffer.withUnsafeReadableBytes { bytes in
            HeadFields.parse(UnsafeRawBufferPointer(rebasing: bytes[0..<end]))
        }
        buffer.moveReaderIndex(forwardBy: end)
        guard let fields = parsed else { throw fail("malformed response head") }
        if fields.status >= 100, fields.status < 200, fields.status != 101 { return .some(nil) }
        return .some(fields)
    }

    /// Chooses how the body is framed; returns the response when it has none.
    private mutating func startBody(_ fields: HeadFields) throws(Failure) -> Response? {
        let head = Head(status: fields.status, keepAlive: fields.keepAlive)
        if head.status == 204 || head.status == 304 || head.status == 101 {
            return finish(head, Self.empty)
        }
        if fields.chunked {
            state = .chunkSize(head, body: Self.empty)
        } else if let length = fields.contentLength {
            guard length <= maxBodyBytes else { throw fail("response body too large") }
            state = .body(head, remaining: length)
        } else {
            state = .untilClose(Head(status: head.status, keepAlive: false))
        }
        return nil
    }
}

/// What a response head says about framing, read without building header strings.
struct HeadFields: Equatable {
    var status = 0
    var contentLength: Int?
    var chunked = false
    var keepAlive = true

    /// Parses `HTTP/1.x SSS reason CRLF (name: value CRLF)* CRLF`.
    static func parse(_ bytes: UnsafeRawBufferPointer) -> HeadFields? {
        var fields = HeadFields()
        let count = bytes.count
        // Status line.
        guard count >= 12, bytes[0] == UInt8(ascii: "H"), bytes[1] == UInt8(ascii: "T"), bytes[2] == UInt8(ascii: "T"),
            bytes[3] == UInt8(ascii: "P"), bytes[4] == UInt8(ascii: "/"), bytes[5] == UInt8(ascii: "1"),
            bytes[6] == UInt8(ascii: "."), bytes[8] == UInt8(ascii: " ")
        else { return nil }
        let http10 = bytes[7] == UInt8(ascii: "0")
        guard http10 || bytes[7] == UInt8(ascii: "1") else { return nil }
        var status = 0
        for k in 9..<12 {
            let c = bytes[k]
            guard c >= 0x30, c <= 0x39 else { return nil }
            status = status * 10 + Int(c - 0x30)
        }
        fields.status = status
        var i = 12
        while i < count, bytes[i] != 0x0A { i += 1 }
        i += 1
        var keepAliveSaid = false
        var closeSaid = false
        // Header lines.
        while i < count {
            var lineEnd = i
            while lineEnd < count, bytes[lineEnd] != 0x0A { lineEnd += 1 }
            var end = lineEnd
            if end > i, bytes[end - 1] == 0x0D { end -= 1 }
            if end == i { break }  // the blank line
            var colon = i
            while colon < end, bytes[colon] != UInt8(ascii: ":") { colon += 1 }
            guard colon < end, colon > i else { return nil }
            let name = UnsafeRawBufferPointer(rebasing: bytes[i..<colon])
            var valueStart = colon + 1
            while valueStart < end, bytes[valueStart] == 0x20 || bytes[valueStart] == 0x09 { valueStart += 1 }
            var valueEnd = end
            while valueEnd > valueStart, bytes[valueEnd - 1] == 0x20 || bytes[valueEnd - 1] == 0x09 { valueEnd -= 1 }
            let value = UnsafeRawBufferPointer(rebasing: bytes[valueStart..<valueEnd])
            if equalsIgnoringCase(name, "content-length") {
                var n = 0
                guard value.count > 0, value.count <= 15 else { return nil }
                for c in value {
                    guard c >= 0x30, c <= 0x39 else { return nil }
                    n = n * 10 + Int(c - 0x30)
                }
                if let previous = fields.contentLength, previous != n { return nil }
                fields.contentLength = n
            } else if equalsIgnoringCase(name, "transfer-encoding") {
                // The last coding decides: only `chunked` is understood.
                if endsWithIgnoringCase(value, "chunked") {
                    fields.chunked = true
                } else {
                    return nil
                }
            } else if equalsIgnoringCase(name, "connection") {
                if containsIgnoringCase(value, "close") { closeSaid = true }
                if containsIgnoringCase(value, "keep-alive") { keepAliveSaid = true }
            }
            i = lineEnd + 1
        }
        fields.keepAlive = !closeSaid && (!http10 || keepAliveSaid)
        if fields.chunked { fields.contentLength = nil }
        return fields
    }

    @inline(__always) private static func lower(_ c: UInt8) -> UInt8 { c >= 0x41 && c <= 0x5A ? c | 0x20 : c }

    private static func equalsIgnoringCase(_ bytes: UnsafeRawBufferPointer, _ word: StaticString) -> Bool {
        guard bytes.count == word.utf8CodeUnitCount else { return false }
        let w = word.utf8Start
        for k in 0..<bytes.count where lower(bytes[k]) != w[k] { return false }
        return true
    }

    private static func endsWithIgnoringCase(_ bytes: UnsafeRawBufferPointer, _ word: StaticString) -> Bool {
        let n = word.utf8CodeUnitCount
        guard bytes.count >= n else { return false }
        return equalsIgnoringCase(UnsafeRawBufferPointer(rebasing: bytes[(bytes.count - n)...]), word)
    }

    private static func containsIgnoringCase(_ bytes: UnsafeRawBufferPointer, _ word: StaticString) -> Bool {
        let n = word.utf8CodeUnitCount
        guard bytes.count >= n else { return false }
        for start in 0...(bytes.count - n)
        where equalsIgnoringCase(UnsafeRawBufferPointer(rebasing: bytes[start..<(start + n)]), word) {
            return true
        }
        return false
    }
}
