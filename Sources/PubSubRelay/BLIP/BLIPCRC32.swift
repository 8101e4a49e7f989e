/// CRC-32 (IEEE 802.3, the polynomial of zlib's `crc32`), continued across calls: BLIP's frame checksum is the
/// running CRC of every uncompressed payload byte sent in one direction.
public struct BLIPCRC32: Sendable, Equatable {
    public private(set) var value: UInt32

    public init(value: UInt32 = 0) { self.value = value }

    public mutating func update(_ bytes: some Sequence<UInt8>) {
        var crc = ~value
        for byte in bytes {
            crc = Self.table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8)
        }
        value = ~crc
    }

    static let table: [UInt32] = (0..<256).map { index in
        var crc = UInt32(index)
        for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
        return crc
    }
}
