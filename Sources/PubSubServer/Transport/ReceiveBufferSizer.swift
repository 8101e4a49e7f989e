import NIOCore

/// How much an accepted connection reads at a time: NIO's adaptive rule (`AdaptiveRecvByteBufferAllocator`: double
/// after a read that filled the buffer, halve after two reads in a row of at most half), in 14 bytes. The channel keeps
/// its allocator in an existential, whose inline room is 24 bytes: NIO's own type (33 bytes) lives in a box of its
/// own, copied into every connection on its first read (49 bytes held by each idle socket); this one sits inline.
///
/// It also keeps what an idle connection holds of its reads small. NIO's receive pool
/// (`NIOPooledRecvBufferAllocator`) stores the first buffer a channel reads into for the channel's whole life, and
/// grows it to every size this rule asks for: an idle socket kept a 512-byte buffer and its storage (576 bytes of
/// its ~4 KiB). So the sizer gives the pool no size hint (`nextBufferSize()` is nil) and never lets it reuse
/// (`record` answers "may grow"): every read after the first gets a new buffer of the rule's size, freed when the
/// pipeline is done with it. The pool still stores the first buffer, so the first read is `firstRead` bytes (the
/// rest of the upgrade request comes in the next read). With the server's `maxMessagesPerRead` of 1 the pool keeps
/// no other buffer; with more it would keep one per read of a wake-up.
struct ReceiveBufferSizer: RecvByteBufferAllocator {
    /// The first read's size: the buffer the pool keeps.
    static let firstRead = 16

    private var next: UInt32
    private let minimum: UInt32
    private let maximum: UInt32
    private var decreaseNow = false
    /// Whether a read was recorded: until then, buffers are `firstRead` bytes.
    private var readOnce = false

    /// Sizes are powers of two, as NIO's are: `minimum` and `initial` rounded down, `maximum` up.
    init(minimum: Int, initial: Int, maximum: Int) {
        precondition(0 < minimum && minimum <= initial && initial <= maximum && maximum <= 1 << 30)
        self.minimum = UInt32(minimum).previousPowerOfTwo
        self.next = UInt32(initial).previousPowerOfTwo
        let maximum = UInt32(maximum)
        self.maximum = maximum == maximum.previousPowerOfTwo ? maximum : maximum.previousPowerOfTwo << 1
    }

    /// The next read's buffer: `firstRead` bytes the first time, then `size`.
    func buffer(allocator: ByteBufferAllocator) -> ByteBuffer {
        allocator.buffer(capacity: readOnce ? size : Self.firstRead)
    }

    /// No hint: NIO's pool then reuses no buffer, and grows none.
    func nextBufferSize() -> Int? { nil }

    /// Follows the rule (the first, small read aside) and always answers that the next buffer may differ, so the
    /// pool never reuses the one it stores.
    mutating func record(actualReadBytes: Int) -> Bool {
        if readOnce {
            _ = recordSize(actualReadBytes: actualReadBytes)
        } else {
            readOnce = true
        }
        return true
    }

    /// The rule's next buffer size.
    var size: Int { Int(next) }

    /// The rule itself (NIO's `record`): whether the next buffer grows.
    mutating func recordSize(actualReadBytes: Int) -> Bool {
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
