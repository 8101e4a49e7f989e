import CompressNIO
import NIOCore

/// One direction's raw-deflate stream (zlib `wbits=-15`) for compressed BLIP frames: each frame's payload is
/// deflated with `Z_SYNC_FLUSH` and the trailing `00 00 FF FF` is stripped.
final class BLIPDeflater {
    private let compressor: ZlibCompressor

    init() throws {
        compressor = try ZlibCompressor(algorithm: .deflate)
    }

    func deflate(_ bytes: [UInt8]) throws -> [UInt8] {
        var input = ByteBuffer(bytes: bytes)
        var output = ByteBufferAllocator().buffer(capacity: bytes.count + bytes.count / 8 + 64)
        while true {
            try compressor.deflate(from: &input, to: &output, flush: .sync)
            // Z_SYNC_FLUSH returns Z_OK also when the output filled up: go on until input and output both have room.
            if input.readableBytes == 0 && output.writableBytes > 0 { break }
            output.reserveCapacity(minimumWritableBytes: max(1024, output.capacity))
        }
        var result = Array(output.readableBytesView)
        guard result.count >= 4, result.suffix(4).elementsEqual([0x00, 0x00, 0xFF, 0xFF]) else {
            throw RelayError(.blipProtocol, "deflate did not end with a sync flush marker")
        }
        result.removeLast(4)
        return result
    }
}

/// One direction's raw-inflate stream: `00 00 FF FF` is appended to each compressed frame before inflating it
/// with the same long-lived inflater.
final class BLIPInflater {
    private let decompressor: ZlibDecompressor
    /// Upper bound of one frame's inflated size (a deflate bomb is a fatal error, not an allocation).
    let maxOutput: Int

    init(maxOutput: Int) throws {
        decompressor = try ZlibDecompressor(algorithm: .deflate)
        self.maxOutput = maxOutput
    }

    func inflate(_ bytes: some Collection<UInt8>) throws -> [UInt8] {
        var input = ByteBufferAllocator().buffer(capacity: bytes.count + 4)
        input.writeBytes(bytes)
        input.writeBytes([0x00, 0x00, 0xFF, 0xFF])
        var output = ByteBufferAllocator().buffer(capacity: max(4096, bytes.count * 4))
        while true {
            let before = (input.readableBytes, output.readableBytes)
            do {
                try decompressor.inflate(from: &input, to: &output)
                if input.readableBytes == 0 { break }
            } catch let error as CompressNIOError where error == .bufferOverflow {
                // more output to come
            } catch let error as CompressNIOError where error == .inputBufferOverflow {
                break  // all input consumed; the stream goes on in the next frame
            } catch {
                throw RelayError(.blipProtocol, "bad deflate data in a compressed frame (\(error))")
            }
            if before == (input.readableBytes, output.readableBytes) && output.writableBytes > 0 {
                throw RelayError(.blipProtocol, "bad deflate data in a compressed frame (the stream ended)")
            }
            if output.readableBytes > maxOutput {
                throw RelayError(.blipProtocol, "a compressed frame inflates beyond \(maxOutput) bytes")
            }
            output.reserveCapacity(minimumWritableBytes: max(4096, output.capacity))
        }
        return Array(output.readableBytesView)
    }
}
