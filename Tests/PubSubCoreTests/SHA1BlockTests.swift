import Crypto
import Testing

@testable import PubSubCore

/// The position cipher's SHA-1 gives Crypto's digest (its first 32 bits) for every length of message it takes.
@Suite struct SHA1BlockTests {
    static func reference(_ bytes: [UInt8]) -> UInt32 {
        Array(Insecure.SHA1.hash(data: bytes)).prefix(4).reduce(0) { $0 << 8 | UInt32($1) }
    }

    static func ours(_ bytes: [UInt8]) -> UInt32 {
        bytes.withUnsafeBytes { SHA1Block.first32Bits(of: $0) }
    }

    @Test func knownDigests() {
        #expect(Self.ours([]) == 0xDA39_A3EE)
        #expect(Self.ours(Array("abc".utf8)) == 0xA999_3E36)
        #expect(Self.ours(Array("The quick brown fox jumps over the lazy dog".utf8)) == 0x2FD4_E1C6)
    }

    @Test func everyLengthMatchesCrypto() {
        var rng = SystemRandomNumberGenerator()
        for count in 0...SHA1Block.maxCount {
            for _ in 0..<50 {
                let bytes = (0..<count).map { _ in UInt8.random(in: 0...255, using: &rng) }
                #expect(Self.ours(bytes) == Self.reference(bytes), "\(bytes)")
            }
        }
    }

    /// The cipher's round function as it was written on Crypto: the permutation is unchanged, so every token
    /// ever handed out still names the same position.
    @Test func theRoundFunctionIsUnchanged() {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            let key = PositionKey.random()
            let (round, half) = (
                Int.random(in: 0..<PositionCipher.rounds, using: &rng), UInt32.random(in: 0...UInt32.max, using: &rng)
            )
            var message = key.bytes + [UInt8(ascii: "0") + UInt8(round)]
            message += Array(String(half, radix: 16).leftPadded(to: 8).utf8)
            #expect(PositionCipher.function(round, half, key: key) == Self.reference(message))
        }
    }
}

extension String {
    fileprivate func leftPadded(to count: Int) -> String {
        String(repeating: "0", count: max(0, count - self.count)) + self
    }
}
