import CompressNIO
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

/// permessage-deflate (RFC 7692) as this server speaks it: no context kept on either side, so that nothing is
/// held per connection. The server compresses each event once per publish (`EventCompression`) and never keeps
/// its window (`server_no_context_takeover`); it asks clients not to keep theirs (`client_no_context_takeover`,
/// which §7.1.1.2 lets a server put in its answer whether or not it was offered), so that each compressed message
/// a client sends inflates on its own, with a stream borrowed for that message from a pool.
enum PerMessageDeflate {
    /// What the 101 response says in `Sec-WebSocket-Extensions` when an offer is accepted.
    static let response = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"

    /// The response to the client's offers (`Sec-WebSocket-Extensions`, in order of preference), or nil to go on
    /// uncompressed: the first permessage-deflate offer this server can honour. An offer with a parameter it
    /// does not know, a repeated parameter, or a server window smaller than 15 bits (every event is compressed
    /// once with the full window, for everyone) is declined.
    static func negotiate(_ headers: HTTPHeaders) -> String? {
        for value in headers["sec-websocket-extensions"] {
            for offer in value.split(separator: ",") where accepts(offer) { return response }
        }
        return nil
    }

    private static func accepts(_ offer: Substring) -> Bool {
        let parts = offer.split(separator: ";").map { $0.trimmingSpaces() }
        guard parts.first?.lowercased() == "permessage-deflate" else { return false }
        var seen = Set<String>()
        for parameter in parts.dropFirst() {
            let pair = parameter.split(separator: "=", maxSplits: 1).map { $0.trimmingSpaces() }
            let name = pair[0].lowercased()
            let value = pair.count > 1 ? pair[1].trimmingCharacters(in: "\"") : nil
            guard seen.insert(name).inserted else { return false }
            switch name {
            case "server_no_context_takeover", "client_no_context_takeover":
                guard value == nil else { return false }
            case "server_max_window_bits":
                guard value == "15" else { return false }
            case "client_max_window_bits":
                // Inflating with a 15-bit window reads a stream made with any smaller one: nothing to answer.
                guard value == nil || (value.flatMap(Int.init).map { (8...15).contains($0) } ?? false) else {
                    return false
                }
            default:
                return false
            }
        }
        return true
    }

    enum InflateError: Error, Equatable {
        /// The message inflates past the limit (close 1009): inflating stopped there.
        case tooLarge
        /// Not a DEFLATE stream (close 1007).
        case corrupt
    }

    /// A compressed message's payload inflated, at most `limit` bytes: the output grows as it fills, so a small
    /// message costs a small buffer, and a bomb stops at the limit without inflating the rest.
    static func inflate(_ payload: ByteBuffer, limit: Int) throws(InflateError) -> ByteBuffer {
        let inflater = inflaters.take()
        defer { inflaters.give(inflater) }
        guard let inflater else { throw .corrupt }
        var input = payload
        input.writeBytes([0x00, 0x00, 0xFF, 0xFF])
        var output = ByteBufferAllocator().buffer(capacity: min(limit + 1, max(256, payload.readableBytes * 4)))
        // The output may hold a little more than asked for (its storage grows in powers of two), so the limit is
        // checked on what came out, each time: what is inflated past it is at most that rounding.
        while true {
            do {
                try inflater.inflate(from: &input, to: &output)
                guard output.readableBytes <= limit else { throw InflateError.tooLarge }
                return output
            } catch let error as CompressNIOError where error == .bufferOverflow {
                guard output.readableBytes <= limit else { throw .tooLarge }
                output.reserveCapacity(min(limit + 1, output.capacity * 2))
            } catch let error as CompressNIOError where error == .inputBufferOverflow {
                guard output.readableBytes <= limit else { throw .tooLarge }
                return output
            } catch InflateError.tooLarge {
                throw .tooLarge
            } catch {
                throw .corrupt
            }
        }
    }

    private static let inflaters = InflaterPool()
}

/// Raw-inflate streams reused across messages (a stream's window is 32 KiB): one is borrowed for one message,
/// reset, and given back.
// @unchecked: the pool is guarded by the lock of `idle`; a zlib stream (not Sendable) is used by one thread at a
// time, handed over under that lock.
final class InflaterPool: @unchecked Sendable {
    private let idle = NIOLockedValueBox<[ZlibDecompressor]>([])
    private let keep = 8

    func take() -> ZlibDecompressor? {
        idle.withLockedValue { $0.popLast() } ?? (try? ZlibDecompressor(algorithm: .deflate))
    }

    func give(_ inflater: ZlibDecompressor?) {
        guard let inflater, (try? inflater.reset()) != nil else { return }
        idle.withLockedValue { if $0.count < keep { $0.append(inflater) } }
    }
}

extension Substring {
    fileprivate func trimmingSpaces() -> Substring {
        var slice = self
        while slice.first == " " || slice.first == "\t" { slice = slice.dropFirst() }
        while slice.last == " " || slice.last == "\t" { slice = slice.dropLast() }
        return slice
    }

    fileprivate func trimmingCharacters(in set: String) -> String {
        String(self.drop(while: { set.contains($0) }).reversed().drop(while: { set.contains($0) }).reversed())
    }
}
