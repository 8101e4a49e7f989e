import NIOCore
import NIOHTTP1

/// Reads one request at a time: its head, then its body up to `maxBytes`. The head and body are let go once the
/// request is whole and routed: a parked connect keeps neither (the body is a slice of a whole receive buffer,
/// the head carries every header and the URI).
struct HTTPRequestReader {
    enum Progress {
        case reading
        /// Over `maxBytes` (by `Content-Length` or by what arrived): answered 413, the rest is ignored.
        case tooLarge
        case request(HTTPRequestHead, ByteBuffer?)
    }

    let maxBytes: Int
    private var head: HTTPRequestHead?
    private var body: ByteBuffer?
    /// The current request was refused as too large.
    private(set) var rejected = false

    init(maxBytes: Int) {
        self.maxBytes = maxBytes
    }

    mutating func read(_ part: HTTPServerRequestPart) -> Progress {
        switch part {
        case .head(let head):
            (self.head, body, rejected) = (head, nil, false)
            guard let length = head.headers.first(name: "content-length").flatMap(Int.init), length > maxBytes else {
                return .reading
            }
            return reject()
        case .body(var chunk):
            guard !rejected else { return .reading }
            if (body?.readableBytes ?? 0) + chunk.readableBytes > maxBytes { return reject() }
            if body == nil { body = chunk } else { body!.writeBuffer(&chunk) }
            return .reading
        case .end:
            guard !rejected, let head else { return .reading }
            defer { (self.head, body) = (nil, nil) }
            return .request(head, body)
        }
    }

    private mutating func reject() -> Progress {
        rejected = true
        body = nil
        return .tooLarge
    }
}
