/// SHA-1 of a message that fits one block (at most 55 bytes), the first 32 bits of its digest: all the position
/// cipher's round function takes, six times per publish. `Crypto.Insecure.SHA1` keeps its context in a heap
/// object, one allocation per hash; this works on the stack. Tested against `Insecure.SHA1` for every length it
/// takes (`SHA1BlockTests`), and through the cipher against the Redis engine's Lua.
enum SHA1Block {
    static let maxCount = 55

    static func first32Bits(of message: UnsafeRawBufferPointer) -> UInt32 {
        precondition(message.count <= maxCount, "a message of \(message.count) bytes is more than one block")
        return withUnsafeTemporaryAllocation(of: UInt32.self, capacity: 80) { w in
            // The block: the message, 0x80, zeros, then its length in bits (64-bit big-endian; under 2^32 here).
            for i in 0..<16 { w[i] = 0 }
            for (i, byte) in message.enumerated() { w[i >> 2] |= UInt32(byte) << UInt32(24 - 8 * (i & 3)) }
            let n = message.count
            w[n >> 2] |= 0x80 << UInt32(24 - 8 * (n & 3))
            w[15] = UInt32(n * 8)
            for t in 16..<80 { w[t] = rotate(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1) }
            let h0: UInt32 = 0x6745_2301
            var (a, b, c, d, e): (UInt32, UInt32, UInt32, UInt32, UInt32) = (
                h0, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0
            )
            for t in 0..<80 {
                let f: UInt32
                let k: UInt32
                switch t {
                case 0..<20: (f, k) = ((b & c) | (~b & d), 0x5A82_7999)
                case 20..<40: (f, k) = (b ^ c ^ d, 0x6ED9_EBA1)
                case 40..<60: (f, k) = ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC)
                default: (f, k) = (b ^ c ^ d, 0xCA62_C1D6)
                }
                let next = rotate(a, 5) &+ f &+ e &+ k &+ w[t]
                (e, d, c, b, a) = (d, c, rotate(b, 30), a, next)
            }
            return h0 &+ a
        }
    }

    private static func rotate(_ x: UInt32, _ n: UInt32) -> UInt32 { x << n | x >> (32 - n) }
}
