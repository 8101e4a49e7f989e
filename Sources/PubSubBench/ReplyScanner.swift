/// Reads what a Bayeux server (or a Centrifuge node) sends without building a JSON tree for every event: one pass over the bytes finds
/// each top-level object; an object carrying the bench marker (`"_pb":[publisher,channel,sequence,sentAt]`) is an
/// event and only those four numbers are read; anything else is a reply, checked cheaply and parsed in full only
/// when it is not a plain success.
enum ReplyScanner {
    struct Marker: Equatable {
        var publisher: Int
        var channel: Int
        var sequence: UInt32
        var sentAt: UInt64
    }

    enum Item {
        case event(Marker)
        /// A reply (or an event without a marker): its bytes.
        case other(UnsafeRawBufferPointer)
    }

    /// Calls `body` for every top-level object of a JSON array (or for the value itself when it is an object).
    /// Returns false when the text is not an object or an array of objects.
    @discardableResult
    static func scan(_ bytes: UnsafeRawBufferPointer, _ body: (Item) -> Void) -> Bool {
        let count = bytes.count
        var i = 0
        while i < count, isSpace(bytes[i]) { i += 1 }
        guard i < count else { return false }
        if bytes[i] == UInt8(ascii: "{") {
            // One object, or several separated by white space (Centrifuge's JSON protocol, one per line).
            while i < count {
                guard bytes[i] == UInt8(ascii: "{"), let end = objectEnd(bytes, from: i) else { return false }
                emit(UnsafeRawBufferPointer(rebasing: bytes[i..<end]), body)
                i = end
                while i < count, isSpace(bytes[i]) { i += 1 }
            }
            return true
        }
        guard bytes[i] == UInt8(ascii: "[") else { return false }
        i += 1
        while i < count {
            let c = bytes[i]
            if c == UInt8(ascii: "{") {
                guard let end = objectEnd(bytes, from: i) else { return false }
                emit(UnsafeRawBufferPointer(rebasing: bytes[i..<end]), body)
                i = end
            } else if c == UInt8(ascii: "]") {
                return true
            } else if c == UInt8(ascii: ",") || isSpace(c) {
                i += 1
            } else {
                return false
            }
        }
        return false
    }

    private static func emit(_ object: UnsafeRawBufferPointer, _ body: (Item) -> Void) {
        if let marker = marker(in: object) { body(.event(marker)) } else { body(.other(object)) }
    }

    @inline(__always) private static func isSpace(_ c: UInt8) -> Bool {
        c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09
    }

    /// The index just past the object starting at `start`, tracking strings and nesting.
    private static func objectEnd(_ bytes: UnsafeRawBufferPointer, from start: Int) -> Int? {
        var depth = 0
        var i = start
        let count = bytes.count
        while i < count {
            let c = bytes[i]
            if c == UInt8(ascii: "\"") {
                i += 1
                while i < count {
                    let s = bytes[i]
                    if s == UInt8(ascii: "\\") {
                        i += 2
                        continue
                    }
                    if s == UInt8(ascii: "\"") { break }
                    i += 1
                }
            } else if c == UInt8(ascii: "{") || c == UInt8(ascii: "[") {
                depth += 1
            } else if c == UInt8(ascii: "}") || c == UInt8(ascii: "]") {
                depth -= 1
                if depth == 0 { return i + 1 }
            }
            i += 1
        }
        return nil
    }

    static let markerKey: [UInt8] = Array("\"_pb\":".utf8)

    /// Finds `"_pb":[a,b,c,d]` in an object.
    static func marker(in object: UnsafeRawBufferPointer) -> Marker? {
        guard let at = find(markerKey, in: object) else { return nil }
        var i = at + markerKey.count
        let count = object.count
        while i < count, isSpace(object[i]) { i += 1 }
        guard i < count, object[i] == UInt8(ascii: "[") else { return nil }
        i += 1
        var values: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
        for n in 0..<4 {
            while i < count, isSpace(object[i]) { i += 1 }
            var value: UInt64 = 0
            var digits = 0
            while i < count, object[i] >= 0x30, object[i] <= 0x39 {
                value = value &* 10 &+ UInt64(object[i] - 0x30)
                digits += 1
                i += 1
            }
            guard digits > 0 else { return nil }
            switch n {
            case 0: values.0 = value
            case 1: values.1 = value
            case 2: values.2 = value
            default: values.3 = value
            }
            while i < count, isSpace(object[i]) { i += 1 }
            guard i < count else { return nil }
            if n < 3 {
                guard object[i] == UInt8(ascii: ",") else { return nil }
                i += 1
            }
        }
        return Marker(
            publisher: Int(truncatingIfNeeded: values.0), channel: Int(truncatingIfNeeded: values.1),
            sequence: UInt32(truncatingIfNeeded: values.2), sentAt: values.3)
    }

    /// The offset of `needle` in `haystack`.
    static func find(_ needle: [UInt8], in haystack: UnsafeRawBufferPointer) -> Int? {
        let n = needle.count
        guard n > 0, haystack.count >= n else { return nil }
        let first = needle[0]
        var i = 0
        let last = haystack.count - n
        while i <= last {
            if haystack[i] == first {
                var j = 1
                while j < n, haystack[i + j] == needle[j] { j += 1 }
                if j == n { return i }
            }
            i += 1
        }
        return nil
    }

    /// Replies handled without a JSON parse.
    enum PlainSuccess: Equatable {
        /// `/meta/connect` succeeded: a subscriber polls again.
        case connect
        /// A publish was acknowledged.
        case publish
    }

    /// Reads the object's own fields (not those nested in a value), whatever their order and spacing: a
    /// `"successful":true` reply without `data` on `/meta/connect` or on a channel outside `/meta/`. Anything
    /// else (failures, advice to handshake, other meta replies, events without a marker) is nil and left to a
    /// full parse.
    static func plainSuccess(_ object: UnsafeRawBufferPointer) -> PlainSuccess? {
        var channel: UnsafeRawBufferPointer?
        var successful = false
        var hasData = false
        let ok = forEachField(object) { key, value in
            if equals(key, "channel") {
                channel = value
            } else if equals(key, "successful") {
                successful = equals(value, "true")
            } else if equals(key, "data") {
                hasData = true
            }
        }
        guard ok, successful, !hasData, let channel else { return nil }
        if equals(channel, "\"/meta/connect\"") { return .connect }
        if channel.count > 7, equals(UnsafeRawBufferPointer(rebasing: channel[0..<7]), "\"/meta/") { return nil }
        guard channel.count >= 3, channel[0] == UInt8(ascii: "\""), channel[1] == UInt8(ascii: "/") else { return nil }
        return .publish
    }

    /// A Centrifuge reply, `{"id":N,"result":…}` or `{"id":N,"error":{…}}`: the error's JSON, nil for a result.
    /// Nil for an object without an id (a push).
    static func commandReply(_ object: UnsafeRawBufferPointer) -> (id: Int, error: String?)? {
        var id: Int?
        var error: String?
        let ok = forEachField(object) { key, value in
            if equals(key, "id") {
                var n = 0
                for c in value {
                    guard c >= 0x30, c <= 0x39 else { return }
                    n = n &* 10 &+ Int(c - 0x30)
                }
                id = n
            } else if equals(key, "error") {
                error = String(decoding: value, as: UTF8.self)
            }
        }
        guard ok, let id, id > 0 else { return nil }
        return (id, error)
    }

    /// Calls `body` with the raw key (between its quotes) and raw value of each field of a JSON object.
    /// Returns false when the text is not a well-formed sequence of fields.
    static func forEachField(
        _ object: UnsafeRawBufferPointer, _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Void
    ) -> Bool {
        let count = object.count
        var i = 0
        while i < count, isSpace(object[i]) { i += 1 }
        guard i < count, object[i] == UInt8(ascii: "{") else { return false }
        i += 1
        while true {
            while i < count, isSpace(object[i]) { i += 1 }
            guard i < count else { return false }
            if object[i] == UInt8(ascii: "}") { return true }
            guard object[i] == UInt8(ascii: "\"") else { return false }
            let keyStart = i + 1
            guard let keyEnd = stringEnd(object, from: i) else { return false }
            i = keyEnd + 1
            while i < count, isSpace(object[i]) { i += 1 }
            guard i < count, object[i] == UInt8(ascii: ":") else { return false }
            i += 1
            while i < count, isSpace(object[i]) { i += 1 }
            guard i < count else { return false }
            let valueStart = i
            let c = object[i]
            if c == UInt8(ascii: "\"") {
                guard let end = stringEnd(object, from: i) else { return false }
                i = end + 1
            } else if c == UInt8(ascii: "{") || c == UInt8(ascii: "[") {
                guard let end = objectEnd(object, from: i) else { return false }
                i = end
            } else {
                while i < count, object[i] != UInt8(ascii: ","), object[i] != UInt8(ascii: "}"), !isSpace(object[i]) {
                    i += 1
                }
            }
            guard i > valueStart else { return false }
            body(
                UnsafeRawBufferPointer(rebasing: object[keyStart..<keyEnd]),
                UnsafeRawBufferPointer(rebasing: object[valueStart..<i]))
            while i < count, isSpace(object[i]) { i += 1 }
            guard i < count else { return false }
            if object[i] == UInt8(ascii: ",") {
                i += 1
            } else if object[i] != UInt8(ascii: "}") {
                return false
            }
        }
    }

    /// The index of the quote closing the string that opens at `start`.
    private static func stringEnd(_ bytes: UnsafeRawBufferPointer, from start: Int) -> Int? {
        var i = start + 1
        let count = bytes.count
        while i < count {
            let s = bytes[i]
            if s == UInt8(ascii: "\\") {
                i += 2
                continue
            }
            if s == UInt8(ascii: "\"") { return i }
            i += 1
        }
        return nil
    }

    private static func equals(_ bytes: UnsafeRawBufferPointer, _ text: StaticString) -> Bool {
        guard bytes.count == text.utf8CodeUnitCount else { return false }
        let t = text.utf8Start
        for k in 0..<bytes.count where bytes[k] != t[k] { return false }
        return true
    }
}
