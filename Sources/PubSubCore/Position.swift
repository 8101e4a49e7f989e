/// A delivery position: the history epoch and the sequence number of an event. Sequences come from one counter
/// shared by every channel, so they never go on the wire as they are: a client would learn from the gap between
/// two of its positions (or from the handshake's) how much was published on channels it cannot read. The token
/// carries the sequence through a keyed pseudo-random permutation instead (`PositionCipher`).
///
/// The epoch changes whenever the history may have lost messages (a restart of the memory engine, a Redis that
/// lost its data), so a token from before it can never be mistaken for a position in the new history. It is
/// random and says nothing about traffic.
package struct Position: Sendable, Hashable {
    package var epoch: UInt64
    package var sequence: UInt64

    package init(epoch: UInt64, sequence: UInt64) {
        self.epoch = epoch
        self.sequence = sequence
    }

    /// The token format version; tokens of any other version (`1.` tokens held a plain sequence) are foreign.
    package static let version = "2"

    /// `2.<epoch base 36>.<permuted sequence base 36>`; clients store and return it, never parse it.
    package func token(key: PositionKey) -> String {
        Self.version + "." + String(epoch, radix: 36) + "."
            + String(PositionCipher.permute(sequence, key: key), radix: 36)
    }

    /// Reads a token made with `key`; anything malformed or of another format version is nil. A well-formed
    /// token that this broker never issued decodes to an arbitrary sequence, almost surely beyond any held.
    package init?(token: String, key: PositionKey) {
        guard let (epoch, permuted) = Self.parse(token) else { return nil }
        self.init(epoch: epoch, sequence: PositionCipher.unpermute(permuted, key: key))
    }

    /// The epoch and the permuted sequence of a well-formed token (what a node hands to Redis, which holds the key).
    package static func parse(_ token: String) -> (epoch: UInt64, permuted: UInt64)? {
        let parts = token.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].elementsEqual(version.utf8),
            let epoch = base36(parts[1]), let permuted = base36(parts[2])
        else { return nil }
        return (epoch, permuted)
    }

    /// Lowercase base 36, at most 13 digits, no sign; nil on anything else or on overflow.
    private static func base36(_ digits: Substring.UTF8View) -> UInt64? {
        guard !digits.isEmpty, digits.count <= 13 else { return nil }
        var value: UInt64 = 0
        for c in digits {
            let d: UInt64
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt64(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): d = UInt64(c - UInt8(ascii: "a")) + 10
            default: return nil
            }
            let (times, o1) = value.multipliedReportingOverflow(by: 36)
            let (sum, o2) = times.addingReportingOverflow(d)
            if o1 || o2 { return nil }
            value = sum
        }
        return value
    }
}

/// The secret of the position permutation: 32 lowercase hex digits (128 random bits), used as text so that the
/// Redis engine's Lua scripts compute the very same permutation. The memory engine makes one per start; the
/// Redis engine keeps one in Redis beside the epoch, shared by every node.
package struct PositionKey: Sendable, Hashable {
    package let text: String
    let bytes: [UInt8]

    package init?(text: String) {
        guard text.utf8.count == 32, text.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) })
        else { return nil }
        self.text = text
        self.bytes = Array(text.utf8)
    }

    package static func random() -> PositionKey {
        var generator = SystemRandomNumberGenerator()
        let hex = (0..<2).map { _ -> String in
            let s = String(generator.next() as UInt64, radix: 16)
            return String(repeating: "0", count: 16 - s.count) + s
        }
        return PositionKey(text: hex.joined())!
    }
}

/// A keyed pseudo-random permutation of 64-bit numbers: a balanced Feistel network over two 32-bit halves, whose
/// round function is the first 32 bits of `SHA-1(key ‖ "0"+round ‖ hex8(half))`. Four rounds with a
/// pseudo-random round function make a strong pseudo-random permutation (Luby–Rackoff); with 32-bit halves that
/// holds up to about 2^16 queries, so six rounds are used for margin (Patarin), at six SHA-1 of 41 bytes per
/// publish. Redis' Lua has `redis.sha1hex` and `bit.bxor`, so `RedisScripts` computes the same function
/// (golden-tested against this one) inside the publish script, keeping one round trip per publish.
package enum PositionCipher {
    package static let rounds = 6

    package static func permute(_ value: UInt64, key: PositionKey) -> UInt64 {
        var left = UInt32(truncatingIfNeeded: value >> 32)
        var right = UInt32(truncatingIfNeeded: value)
        for round in 0..<rounds {
            (left, right) = (right, left ^ function(round, right, key: key))
        }
        return UInt64(left) << 32 | UInt64(right)
    }

    package static func unpermute(_ value: UInt64, key: PositionKey) -> UInt64 {
        var left = UInt32(truncatingIfNeeded: value >> 32)
        var right = UInt32(truncatingIfNeeded: value)
        for round in (0..<rounds).reversed() {
            (left, right) = (right ^ function(round, left, key: key), left)
        }
        return UInt64(left) << 32 | UInt64(right)
    }

    static func function(_ round: Int, _ half: UInt32, key: PositionKey) -> UInt32 {
        let count = key.bytes.count + 9
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: count) { message in
            _ = message.initialize(from: key.bytes)
            message[key.bytes.count] = UInt8(ascii: "0") + UInt8(round)
            for i in 0..<8 {
                let nibble = UInt8((half >> UInt32(28 - 4 * i)) & 15)
                message[key.bytes.count + 1 + i] =
                    nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "a") + nibble - 10
            }
            return SHA1Block.first32Bits(of: UnsafeRawBufferPointer(message))
        }
    }
}
