import Bayeux
import CompressNIO
import NIOConcurrencyHelpers
import NIOCore

/// WebSocket compression of events (permessage-deflate, RFC 7692), paid once per publish: an encoded event of
/// at least `minimumBytes` is compressed when its `WireEvent` is made, and every WebSocket recipient that
/// negotiated compression writes that same compressed frame; the others, and every other transport, never see it.
///
/// Compression keeps no context from one event to the next (`server_no_context_takeover`): a recipient needs no
/// earlier message to inflate one, and nothing is held per connection.
public struct EventCompression: Sendable, Equatable {
    /// Events shorter than this go uncompressed (a frame header and deflate's own framing outweigh the gain).
    public var minimumBytes: Int

    public static let defaultMinimumBytes = 256

    public init(minimumBytes: Int = EventCompression.defaultMinimumBytes) {
        self.minimumBytes = minimumBytes
    }

    /// The final, compressed text frame (FIN, RSV1, text) carrying `json`'s readable bytes deflated; nil when they
    /// are too short or do not shrink.
    public func compressedFrame(of json: ByteBuffer) -> ByteBuffer? {
        guard json.readableBytes >= minimumBytes,
            let deflated = Self.deflaters.deflate(json, headroom: WireEvent.headroom),
            deflated.readableBytes < json.readableBytes
        else { return nil }
        // The output buffer was sized for the worst case (about the input): kept as it is, a 1 MiB event that
        // deflates to 10 KiB would hold 1 MiB more.
        var frame = WireEvent.trimmed(deflated)
        let count = frame.readableBytes
        let start = frame.readerIndex - WireEvent.headerLength(ofPayload: count)
        WireEvent.writeHeader(first: WireEvent.compressedText, payloadLength: count, in: &frame, at: start)
        frame.moveReaderIndex(to: start)
        return frame
    }

    private static let deflaters = DeflaterPool()
}

/// Raw-deflate streams reused across publishes (zlib's state is about 256 KiB; making one per event would cost
/// more than the compression): taken from the pool for one event, reset, and given back.
// @unchecked: the pool is guarded by the lock of `idle`; a zlib stream (not Sendable) is used by one thread at a
// time, handed over under that lock.
final class DeflaterPool: @unchecked Sendable {
    private let idle = NIOLockedValueBox<[ZlibCompressor]>([])
    /// At most this many streams wait in the pool (one per thread that publishes at once is enough).
    private let keep = 8

    /// `event`'s readable bytes compressed and sync-flushed, the trailing `00 00 ff ff` removed (RFC 7692 §7.2.1),
    /// behind `headroom` free bytes (for a frame header).
    func deflate(_ event: ByteBuffer, headroom: Int) -> ByteBuffer? {
        guard let compressor = idle.withLockedValue({ $0.popLast() }) ?? (try? ZlibCompressor(algorithm: .deflate))
        else { return nil }
        defer {
            if (try? compressor.reset()) != nil {
                idle.withLockedValue { if $0.count < keep { $0.append(compressor) } }
            }
        }
        var input = event
        var output = ByteBufferAllocator().buffer(capacity: headroom + compressor.maxSize(from: input))
        output.moveWriterIndex(forwardBy: headroom)
        output.moveReaderIndex(forwardBy: headroom)
        guard (try? compressor.deflate(from: &input, to: &output, flush: .sync)) != nil, input.readableBytes == 0,
            output.readableBytes >= 4,
            output.getInteger(at: output.writerIndex - 4, as: UInt32.self) == 0x0000_FFFF
        else { return nil }
        output.moveWriterIndex(to: output.writerIndex - 4)
        return output
    }
}
