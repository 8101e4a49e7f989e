import Testing

@testable import NIOCore

@testable import PubSubServer

/// The sizer follows NIO's adaptive rule read for read, stays small enough to sit inline in an existential, and
/// leaves NIO's receive pool holding only its small first buffer.
@Suite struct ReceiveBufferSizerTests {
    @Test func fitsInlineInAnExistential() {
        #expect(MemoryLayout<ReceiveBufferSizer>.size <= 3 * MemoryLayout<Int>.size)
    }

    @Test func followsNIOsAdaptiveAllocator() {
        var ours = ReceiveBufferSizer(minimum: 64, initial: 512, maximum: 65536)
        var nio = AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 512, maximum: 65536)
        // Full reads up past the maximum, small reads down past the minimum, and mixtures in between.
        let reads =
            [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 65536, 65536, 10, 10, 10, 40000, 10, 5000]
            + Array(repeating: 1, count: 30) + [64, 64, 128, 63, 300, 300, 0, 0, 1 << 20]
        for read in reads {
            #expect(
                ours.recordSize(actualReadBytes: read) == nio.record(actualReadBytes: read), "after a read of \(read)")
            #expect(ours.size == nio.nextBufferSize(), "after a read of \(read)")
        }
    }

    @Test func roundsSizesToPowersOfTwoAsNIODoes() {
        var ours = ReceiveBufferSizer(minimum: 100, initial: 700, maximum: 5000)
        var nio = AdaptiveRecvByteBufferAllocator(minimum: 100, initial: 700, maximum: 5000)
        #expect(ours.size == 512)
        for read in [512, 1024, 2048, 4096, 8192, 8192, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1] {
            #expect(
                ours.recordSize(actualReadBytes: read) == nio.record(actualReadBytes: read), "after a read of \(read)")
            #expect(ours.size == nio.nextBufferSize(), "after a read of \(read)")
        }
    }

    /// The channel's reads as `BaseStreamSocketChannel` makes them, one per wake-up (`maxMessagesPerRead` 1): the
    /// first reads `firstRead` bytes, the next ones the rule's sizes, each into a buffer of its own that the pool
    /// does not keep, whether the pipeline still holds the last one or not.
    @Test func thePoolKeepsOnlyTheSmallFirstBuffer() {
        let allocator = ByteBufferAllocator()
        var pool = NIOPooledRecvBufferAllocator(
            capacity: 1, recvAllocator: ReceiveBufferSizer(minimum: 64, initial: 512, maximum: 65536))
        var capacities: [Int] = []
        var held: [ByteBuffer] = []
        // Read sizes: the first fills its 16 bytes; then full reads double the buffer, small ones halve it.
        for (index, read) in [16, 512, 1024, 100, 100, 100, 100].enumerated() {
            let (buffer, capacity) = pool.buffer(allocator: allocator) { buffer -> Int in
                buffer.writeRepeatingByte(0x41, count: min(read, buffer.writableBytes))
                return buffer.capacity
            }
            pool.record(actualReadBytes: buffer.readableBytes)
            capacities.append(capacity)
            if index.isMultiple(of: 2) { held.append(buffer) }
            #expect(pool.count == 1, "after read \(index)")
            #expect(pool._buffer?.capacity == ReceiveBufferSizer.firstRead, "after read \(index)")
        }
        #expect(capacities == [16, 512, 1024, 2048, 2048, 1024, 1024])
    }
}
