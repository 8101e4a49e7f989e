/// Unsigned LEB128 varints as BLIP writes them (Go's `binary.PutUvarint`): 7 bits per byte, least significant
/// group first, the high bit set on every byte but the last.
public enum BLIPVarint {
    /// Appends `value` to `bytes`.
    public static func write(_ value: UInt64, to bytes: inout [UInt8]) {
        var value = value
        while value >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        bytes.append(UInt8(value))
    }

    public static func encode(_ value: UInt64) -> [UInt8] {
        var bytes: [UInt8] = []
        write(value, to: &bytes)
        return bytes
    }

    /// Reads a varint at `offset` and moves `offset` past it; nil when the bytes end first or the value does
    /// not fit in 64 bits.
    public static func read(_ bytes: some Collection<UInt8>, at offset: inout Int) -> UInt64? {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        var index = bytes.index(bytes.startIndex, offsetBy: offset)
        var consumed = 0
        while index != bytes.endIndex {
            let byte = bytes[index]
            consumed += 1
            if shift == 63 && byte > 1 { return nil }
            value |= UInt64(byte & 0x7F) << shift
            if byte & 0x80 == 0 {
                offset += consumed
                return value
            }
            shift += 7
            if shift > 63 { return nil }
            index = bytes.index(after: index)
        }
        return nil
    }
}
