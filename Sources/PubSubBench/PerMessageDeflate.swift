import CompressNIO
import NIOCore
import NIOHTTP1

/// WebSocket compression (permessage-deflate, RFC 7692) on the load generator's side (`--compression`): the
/// clients offer it with no context kept on either side, read compressed messages by inflating each on its own, and
/// send uncompressed (a client may choose per message). No context taken over means a message needs no earlier one,
/// so one inflater per event loop, reset after each message, serves every connection of that loop.
enum PerMessageDeflate {
    /// What the clients send in `Sec-WebSocket-Extensions`.
    static let offer = "permessage-deflate; client_no_context_takeover; server_no_context_takeover"

    /// Whether a 101 response accepted permessage-deflate (its `Sec-WebSocket-Extensions` names it).
    static func negotiated(_ headers: HTTPHeaders) -> Bool {
        negotiated(extensions: headers["sec-websocket-extensions"])
    }

    /// Whether these values of `Sec-WebSocket-Extensions` name permessage-deflate.
    static func negotiated(extensions: [String]) -> Bool {
        extensions.contains { value in
            value.split(separator: ",").contains { extensionOffer in
                let name = extensionOffer.split(separator: ";").first.map { $0.filter { $0 != " " && $0 != "\t" } }
                return name?.lowercased() == "permessage-deflate"
            }
        }
    }

    /// The length of an unmasked frame header (a server's) for a payload of `count` bytes.
    static func headerLength(ofPayload count: Int) -> Int {
        count <= 125 ? 2 : count <= 0xFFFF ? 4 : 10
    }
}

/// One event loop's compression streams: the inflater for compressed messages, and a deflater that measures what
/// zlib alone makes of a sample of the messages received (the figure the wire bytes are compared with). Touched
/// only on its loop.
///
/// The loop's subscribers mostly read the same messages (a server that compresses once per publish sends every
/// recipient the same bytes), so the last `recentLimit` messages inflated (up to 16 KiB each) are kept by their compressed bytes, and
/// one met again is not inflated again. With no context taken over, the same compressed bytes always inflate to
/// the same text, so what a client reads is unchanged; the load generator, which shares the machine with the
/// server it measures, then spends on a compressed delivery about what it spends on a plain one.
final class LoopCompression {
    private var inflater: ZlibDecompressor?
    private var deflater: ZlibCompressor?
    /// Recently inflated messages by their compressed payload, and the payloads oldest first: at most `recentLimit`
    /// of them, each at most `recentBytesLimit` bytes inflated (a larger one is inflated every time).
    private var recent: [ByteBuffer: ByteBuffer] = [:]
    private var recentOrder = CircularBuffer<ByteBuffer>()
    static let recentLimit = 64
    static let recentBytesLimit = 16 * 1024
    var recentCount: Int { recent.count }

    /// A compressed message's payload inflated, from the recent messages when it is one of them.
    func inflate(_ payload: ByteBuffer, limit: Int) -> ByteBuffer? {
        if let known = recent[payload] { return known.readableBytes <= limit ? known : nil }
        guard let text = inflateAnew(payload, limit: limit) else { return nil }
        guard text.readableBytes <= Self.recentBytesLimit else { return text }
        // A copy: the payload is a slice of the read buffer, which may be much larger.
        var key = ByteBufferAllocator().buffer(capacity: payload.readableBytes)
        key.writeImmutableBuffer(payload)
        recent[key] = text
        recentOrder.append(key)
        if recentOrder.count > Self.recentLimit { recent[recentOrder.removeFirst()] = nil }
        return text
    }

    /// A compressed message's payload inflated (`00 00 ff ff` appended, as RFC 7692 §7.2.2 says), at most `limit`
    /// bytes; nil when it is not a DEFLATE stream or inflates past the limit.
    func inflateAnew(_ payload: ByteBuffer, limit: Int) -> ByteBuffer? {
        if inflater == nil { inflater = try? ZlibDecompressor(algorithm: .deflate) }
        guard let inflater else { return nil }
        defer { try? inflater.reset() }
        var input = payload
        input.writeBytes([0x00, 0x00, 0xFF, 0xFF])
        var output = ByteBufferAllocator().buffer(capacity: min(limit + 1, max(512, payload.readableBytes * 6)))
        while true {
            do {
                try inflater.inflate(from: &input, to: &output)
                return output
            } catch let error as CompressNIOError where error == .bufferOverflow {
                guard output.readableBytes <= limit, output.capacity <= limit else { return nil }
                output.reserveCapacity(min(limit + 1, output.capacity * 2))
            } catch let error as CompressNIOError where error == .inputBufferOverflow {
                return output
            } catch {
                return nil
            }
        }
    }

    /// The bytes of a server frame carrying `message` compressed by zlib alone, as a permessage-deflate sender with
    /// no context would make it: raw DEFLATE at zlib's default level (6) and window (15 bits), sync-flushed, the
    /// trailing `00 00 ff ff` removed, plus the frame header. Python's `zlib.compressobj(wbits=-15)` with
    /// `Z_SYNC_FLUSH` gives the same bytes.
    func zlibAloneFrameBytes(_ message: ByteBuffer) -> Int? {
        if deflater == nil { deflater = try? ZlibCompressor(algorithm: .deflate) }
        guard let deflater else { return nil }
        defer { try? deflater.reset() }
        var input = message
        var output = ByteBufferAllocator().buffer(capacity: deflater.maxSize(from: input) + 16)
        guard (try? deflater.deflate(from: &input, to: &output, flush: .sync)) != nil, input.readableBytes == 0,
            output.readableBytes >= 4
        else { return nil }
        let payload = output.readableBytes - 4
        return PerMessageDeflate.headerLength(ofPayload: payload) + payload
    }
}
