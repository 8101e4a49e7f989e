/// Reversible escaping of a document id (or any text) into one channel segment of Faye's grammar
/// `[A-Za-z0-9-_!~()$@]+`.
///
/// Letters, digits and `- _ ! ~ ( ) @` are kept; every other UTF-8 byte, `$` included, is written as `$` and two
/// uppercase hex digits. The empty string is written as a lone `$` (never produced otherwise), so every text has
/// a non-empty segment and `unescape(escape(s)) == s` for all `s`.
///
///     ChannelSegment.escape("notes/1 a.b") == "notes$2F1$20a$2Eb"
public enum ChannelSegment {
    public static func escape(_ text: String) -> String {
        if text.isEmpty { return "$" }
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            if isKept(byte) {
                out.append(byte)
            } else {
                out.append(UInt8(ascii: "$"))
                out.append(hexDigit(byte >> 4))
                out.append(hexDigit(byte & 0x0F))
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The text a segment made by `escape` stands for; nil when the segment is not one `escape` can produce.
    public static func unescape(_ segment: String) -> String? {
        if segment == "$" { return "" }
        if segment.isEmpty { return nil }
        let bytes = Array(segment.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        while i < bytes.count {
            let byte = bytes[i]
            if byte == UInt8(ascii: "$") {
                guard i + 2 < bytes.count,
                    let high = hexValue(bytes[i + 1]), let low = hexValue(bytes[i + 2])
                else { return nil }
                let decoded = high << 4 | low
                // Canonical form only: a kept byte is never escaped.
                if isKept(decoded) { return nil }
                out.append(decoded)
                i += 3
            } else if isKept(byte) {
                out.append(byte)
                i += 1
            } else {
                return nil
            }
        }
        return String(validating: out, as: UTF8.self)
    }

    static func isKept(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        case UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "!"), UInt8(ascii: "~"), UInt8(ascii: "("),
            UInt8(ascii: ")"), UInt8(ascii: "@"):
            return true
        default:
            return false
        }
    }

    private static func hexDigit(_ nibble: UInt8) -> UInt8 {
        nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "A") + nibble - 10
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}
