/// Client ids as Faye makes them: 160 random bits in base 36, left-padded with `0` to 31 characters.
public enum ClientID {
    public static func random<G: RandomNumberGenerator>(using generator: inout G) -> String {
        // 160 bits as five 32-bit limbs, most significant first; repeated division by 36.
        var limbs: [UInt32] = (0..<5).map { _ in UInt32.random(in: .min ... .max, using: &generator) }
        let digits = Array("0123456789abcdefghijklmnopqrstuvwxyz".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(31)
        while limbs.contains(where: { $0 != 0 }) {
            var remainder: UInt64 = 0
            for i in limbs.indices {
                let value = remainder << 32 | UInt64(limbs[i])
                limbs[i] = UInt32(value / 36)
                remainder = value % 36
            }
            out.append(digits[Int(remainder)])
        }
        while out.count < 31 { out.append(UInt8(ascii: "0")) }
        return String(decoding: out.reversed(), as: UTF8.self)
    }

    public static func random() -> String {
        var generator = SystemRandomNumberGenerator()
        return random(using: &generator)
    }
}
