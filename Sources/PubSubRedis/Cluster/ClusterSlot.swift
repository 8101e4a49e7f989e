/// Where Redis Cluster keeps a key: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16,384.
///
/// The hash tag is what lies between the first `{` and the first `}` after it, when that is not empty; keys
/// with the same tag are in the same slot (the engine puts all of its keys under one tag, so each script
/// touches one slot).
public enum ClusterSlot {
    public static let count = 16_384

    public static func of(_ key: String) -> Int {
        of(Array(key.utf8))
    }

    public static func of(_ key: [UInt8]) -> Int {
        Int(crc16(hashed(key)) % UInt16(count))
    }

    /// The part of the key that is hashed: its tag, or the whole key.
    static func hashed(_ key: [UInt8]) -> ArraySlice<UInt8> {
        guard let open = key.firstIndex(of: UInt8(ascii: "{")),
            let close = key[(open + 1)...].firstIndex(of: UInt8(ascii: "}")), close > open + 1
        else { return key[...] }
        return key[(open + 1)..<close]
    }

    /// The hash tag of a key, if it has one.
    public static func tag(of key: String) -> String? {
        let bytes = Array(key.utf8)
        let part = hashed(bytes)
        guard part.count < bytes.count else { return nil }
        return String(decoding: part, as: UTF8.self)
    }

    static func crc16(_ bytes: ArraySlice<UInt8>) -> UInt16 {
        var crc: UInt16 = 0
        for byte in bytes {
            crc ^= UInt16(byte) << 8
            for _ in 0..<8 {
                crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1
            }
        }
        return crc
    }
}
