import NIOCore
import Testing

@testable import PubSubServer

/// The sizer follows NIO's adaptive rule read for read, and stays small enough to sit inline in an existential.
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
            #expect(ours.record(actualReadBytes: read) == nio.record(actualReadBytes: read), "after a read of \(read)")
            #expect(ours.nextBufferSize() == nio.nextBufferSize(), "after a read of \(read)")
            #expect(
                ours.buffer(allocator: ByteBufferAllocator()).capacity
                    == nio.buffer(allocator: ByteBufferAllocator()).capacity)
        }
    }

    @Test func roundsSizesToPowersOfTwoAsNIODoes() {
        var ours = ReceiveBufferSizer(minimum: 100, initial: 700, maximum: 5000)
        var nio = AdaptiveRecvByteBufferAllocator(minimum: 100, initial: 700, maximum: 5000)
        #expect(ours.nextBufferSize() == 512)
        for read in [512, 1024, 2048, 4096, 8192, 8192, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1] {
            #expect(ours.record(actualReadBytes: read) == nio.record(actualReadBytes: read), "after a read of \(read)")
            #expect(ours.nextBufferSize() == nio.nextBufferSize(), "after a read of \(read)")
        }
    }
}
