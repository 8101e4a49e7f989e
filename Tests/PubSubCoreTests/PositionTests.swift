import Testing

@testable import PubSubCore

@Suite struct PositionTests {
    static let key = PositionKey(text: "0123456789abcdef0123456789abcdef")!
    static let edges: [UInt64] = [
        0, 1, 2, 35, 36, 1000, 0xffff_ffff, 1 << 32, (1 << 32) + 1, 1 << 52, (1 << 53) - 1, .max,
    ]

    @Test func thePermutationRoundTrips() {
        var rng = SystemRandomNumberGenerator()
        for value in Self.edges + (0..<2000).map({ _ in rng.next() as UInt64 }) {
            let permuted = PositionCipher.permute(value, key: Self.key)
            #expect(PositionCipher.unpermute(permuted, key: Self.key) == value)
        }
    }

    @Test func tokensRoundTripWithTheirKeyOnly() {
        let other = PositionKey(text: "fedcba9876543210fedcba9876543210")!
        for sequence in Self.edges {
            let position = Position(epoch: 0x1234_5678, sequence: sequence)
            let token = position.token(key: Self.key)
            #expect(token.hasPrefix("2." + String(UInt64(0x1234_5678), radix: 36) + "."))
            #expect(Position(token: token, key: Self.key) == position)
            #expect(Position(token: token, key: other)?.sequence != sequence)
        }
    }

    @Test(arguments: [
        "", "garbage", "2", "2.", "2.1", "2..1", "2.1.", "1.1.1", "3.1.1", "2.1.1.1", "2.-1.1", "2.1.-1", "2.+1.1",
        "2.A.1", "2.1.Z", "2.1. 1", "2.1.zzzzzzzzzzzzzz", "2.zzzzzzzzzzzzz.1", "2.1.zzzzzzzzzzzzz",
    ])
    func malformedTokensAreNil(_ token: String) {
        #expect(Position.parse(token) == nil)
        #expect(Position(token: token, key: Self.key) == nil)
    }

    /// The tokens of consecutive sequences look like unrelated random numbers: not consecutive, not ordered,
    /// spread over all 64 bits.
    @Test func consecutiveSequencesGiveUnrelatedTokens() {
        let permuted = (1...1000 as ClosedRange<UInt64>).map { PositionCipher.permute($0, key: Self.key) }
        #expect(Set(permuted).count == 1000)
        let steps = zip(permuted, permuted.dropFirst())
        #expect(steps.allSatisfy { $0.0 &+ 1 != $0.1 && $0.1 &+ 1 != $0.0 })
        let ascending = steps.filter { $0.0 < $0.1 }.count
        #expect((400...600).contains(ascending), "\(ascending) of 999 steps go up")
        // Each bit is set in about half of them (the plain sequences 1...1000 never set a bit above the 10th).
        for bit in 0..<64 {
            let set = permuted.filter { $0 >> UInt64(bit) & 1 == 1 }.count
            #expect((400...600).contains(set), "bit \(bit) is set in \(set) of 1000")
        }
    }

    @Test func randomKeysDiffer() {
        let keys = Set((0..<100).map { _ in PositionKey.random() })
        #expect(keys.count == 100)
        #expect(keys.allSatisfy { PositionKey(text: $0.text) == $0 })
        #expect(PositionKey(text: "0123456789ABCDEF0123456789ABCDEF") == nil)
        #expect(PositionKey(text: "0123") == nil)
    }
}
