import NIOCore

extension ByteBuffer {
    /// Appends the JSON encoding of `value`. `escapeLineSeparators` also escapes U+2028 and U+2029, which
    /// JavaScript (before ES2019) does not accept raw inside a string literal: JSON-P bodies need it.
    public mutating func writeJSON(_ value: JSONValue, escapeLineSeparators: Bool = false) {
        switch value {
        case .null: writeStaticString("null")
        case .bool(let b): writeStaticString(b ? "true" : "false")
        case .number(let text): writeString(text)
        case .string(let s): writeJSONString(s, escapeLineSeparators: escapeLineSeparators)
        case .array(let elements):
            writeInteger(UInt8(ascii: "["))
            var first = true
            for element in elements {
                if !first { writeInteger(UInt8(ascii: ",")) }
                first = false
                writeJSON(element, escapeLineSeparators: escapeLineSeparators)
            }
            writeInteger(UInt8(ascii: "]"))
        case .object(let object):
            writeJSON(object, escapeLineSeparators: escapeLineSeparators)
        }
    }

    public mutating func writeJSON(_ object: JSONObject, escapeLineSeparators: Bool = false) {
        writeInteger(UInt8(ascii: "{"))
        var first = true
        for entry in object.entries {
            if !first { writeInteger(UInt8(ascii: ",")) }
            first = false
            writeJSONString(entry.key, escapeLineSeparators: escapeLineSeparators)
            writeInteger(UInt8(ascii: ":"))
            writeJSON(entry.value, escapeLineSeparators: escapeLineSeparators)
        }
        writeInteger(UInt8(ascii: "}"))
    }

    public mutating func writeJSONString(_ string: String, escapeLineSeparators: Bool = false) {
        writeInteger(UInt8(ascii: "\""))
        var utf8 = string.utf8
        let done: Void? = utf8.withContiguousStorageIfAvailable { bytes in
            self.writeEscaped(bytes, escapeLineSeparators: escapeLineSeparators)
        }
        if done == nil {
            var copy = string
            copy.makeContiguousUTF8()
            utf8 = copy.utf8
            _ = utf8.withContiguousStorageIfAvailable { bytes in
                self.writeEscaped(bytes, escapeLineSeparators: escapeLineSeparators)
            }
        }
        writeInteger(UInt8(ascii: "\""))
    }

    private mutating func writeEscaped(_ bytes: UnsafeBufferPointer<UInt8>, escapeLineSeparators: Bool) {
        var runStart = 0
        var i = 0
        func flush(_ end: Int) {
            if end > runStart {
                writeBytes(UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: bytes[runStart..<end])))
            }
        }
        while i < bytes.count {
            let b = bytes[i]
            var escape: StaticString? = nil
            var width = 1
            switch b {
            case 0x22: escape = "\\\""
            case 0x5C: escape = "\\\\"
            case 0x0A: escape = "\\n"
            case 0x0D: escape = "\\r"
            case 0x09: escape = "\\t"
            case 0x08: escape = "\\b"
            case 0x0C: escape = "\\f"
            case 0xE2
            where escapeLineSeparators && i + 2 < bytes.count && bytes[i + 1] == 0x80
                && (bytes[i + 2] == 0xA8 || bytes[i + 2] == 0xA9):
                escape = bytes[i + 2] == 0xA8 ? "\\u2028" : "\\u2029"
                width = 3
            default:
                if b < 0x20 {
                    flush(i)
                    writeStaticString("\\u00")
                    // b < 0x20: the high digit is 0 or 1, the low one 0-9 or a-f (no table: an array here was an
                    // allocation for every string written).
                    writeInteger(UInt8(ascii: "0") + (b >> 4))
                    let low = b & 0xF
                    writeInteger(low < 10 ? UInt8(ascii: "0") + low : UInt8(ascii: "a") + low - 10)
                    i += 1
                    runStart = i
                    continue
                }
            }
            if let escape {
                flush(i)
                writeStaticString(escape)
                i += width
                runStart = i
            } else {
                i += 1
            }
        }
        flush(bytes.count)
    }
}

extension JSONValue {
    /// The compact JSON text of this value.
    public var jsonString: String {
        var buffer = ByteBufferAllocator().buffer(capacity: 64)
        buffer.writeJSON(self)
        return String(buffer: buffer)
    }
}

extension JSONObject {
    public var jsonString: String { JSONValue.object(self).jsonString }
}
