/// Client ids: 15 characters drawn uniformly from `[0-9a-z]`, about 77 random bits (OWASP asks at least 64 of a
/// session id). Faye's are 160 bits in 31 base-36 characters; the alphabet is Faye's, so that scripts written for
/// Faye's ids (`sed 's/.*"clientId":"\([a-z0-9]*\)".*/\1/'`) read ours. At 15 UTF-8 bytes or fewer a Swift string
/// is stored inline, so an id costs a session, a connection and every table keyed by it no allocation of its own
/// (a 31-character id took 64 bytes of heap in each place that made a copy of it).
public enum ClientID {
    public static let length = 15
    static let alphabet = Array("0123456789abcdefghijklmnopqrstuvwxyz".utf8)

    public static func random<G: RandomNumberGenerator>(using generator: inout G) -> String {
        // A byte below 252 (7 × 36) picks a character without bias; the rest are drawn again.
        var out: [UInt8] = []
        out.reserveCapacity(length)
        while out.count < length {
            var word = generator.next()
            for _ in 0..<8 where out.count < length {
                let byte = UInt8(truncatingIfNeeded: word)
                word >>= 8
                if byte < 252 { out.append(alphabet[Int(byte % 36)]) }
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func random() -> String {
        var generator = SystemRandomNumberGenerator()
        return random(using: &generator)
    }
}
