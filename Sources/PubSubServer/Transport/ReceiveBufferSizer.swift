import NIOCore

/// How much an accepted connection reads at a time: NIO's adaptive rule (`AdaptiveRecvByteBufferAllocator`: double
/// after a read that filled the buffer, halve after two reads in a row of at most half), in 13 bytes. The channel keeps
/// its allocator in an existential, whose inline room is 24 bytes: NIO's own type (33 bytes) lives in a box of its
/// own, copied into every connection on its first read (49 bytes held by each idle socket); this one sits inline.
struct ReceiveBufferSizer: RecvByteBufferAllocator {
    private var next: UInt32
    private let minimum: UInt32
    private let maximum: UInt32
    private var decreaseNow = false

    /// Sizes are powers of two, as NIO's are: `minimum` and `initial` rounded down, `maximum` up.
    init(minimum: Int, initial: Int, maximum: Int) {
        precondition(0 < minimum && minimum <= initial && initial <= maximum && maximum <= 1 << 30)
        self.minimum = UInt32(minimum).previousPowerOfTwo
        self.next = UInt32(initial).previousPowerOfTwo
        let maximum = UInt32(maximum)
        self.maximum = maximum == maximum.previousPowerOfTwo ? maximum : maximum.previousPowerOfTwo << 1
    }

    func buffer(allocator: ByteBufferAllocator) -> ByteBuffer {
        allocator.buffer(capacity: Int(next))
    }

    func nextBufferSize() -> Int? { Int(next) }

    mutating func record(actualReadBytes: Int) -> Bool {
        let half = next >> 1
        if actualReadBytes <= Int(half) && half >= minimum {
            if decreaseNow { next = half }
            decreaseNow.toggle()
            return false
        }
        decreaseNow = false
        guard actualReadBytes >= Int(next), next <= maximum >> 1 else { return false }
        next <<= 1
        return true
    }
}

extension UInt32 {
    fileprivate var previousPowerOfTwo: UInt32 {
        self == 0 ? 0 : 1 << (31 - UInt32(leadingZeroBitCount))
    }
}
