import NIOCore

/// Why a request body is not acceptable JSON. All of these are transport errors (HTTP 400).
public struct JSONParseError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Reason: Sendable, Hashable {
        case unexpectedEnd
        case unexpectedByte(UInt8)
        case invalidUTF8
        case invalidEscape
        case invalidNumber
        case tooDeep(limit: Int)
        case trailingData
    }
    public var reason: Reason
    public var offset: Int

    public var description: String {
        switch reason {
        case .unexpectedEnd: return "unexpected end of JSON"
        case .unexpectedByte(let b): return "unexpected byte 0x\(String(b, radix: 16)) at offset \(offset)"
        case .invalidUTF8: return "invalid UTF-8 at offset \(offset)"
        case .invalidEscape: return "invalid escape at offset \(offset)"
        case .invalidNumber: return "invalid number at offset \(offset)"
        case .tooDeep(let limit): return "JSON nested deeper than \(limit) levels"
        case .trailingData: return "trailing data after JSON at offset \(offset)"
        }
    }
}

/// A strict RFC 8259 parser with a nesting limit, so hostile input can neither exhaust the stack nor
/// smuggle invalid UTF-8 into a delivered message.
public struct JSONParser {
    public var maxDepth: Int

    public init(maxDepth: Int = 64) { self.maxDepth = maxDepth }

    public func parse(_ buffer: ByteBuffer) throws -> JSONValue {
        try buffer.withUnsafeReadableBytes { (raw: UnsafeRawBufferPointer) throws -> JSONValue in
            var reader = Reader(bytes: raw, maxDepth: maxDepth)
            return try reader.parseDocument()
        }
    }

    public func parse(_ bytes: some Collection<UInt8>) throws -> JSONValue {
        let array = Array(bytes)
        return try array.withUnsafeBytes { (raw: UnsafeRawBufferPointer) throws -> JSONValue in
            var reader = Reader(bytes: raw, maxDepth: maxDepth)
            return try reader.parseDocument()
        }
    }

    public func parse(_ string: String) throws -> JSONValue {
        try parse(Array(string.utf8))
    }
}

private struct Reader {
    let bytes: UnsafeRawBufferPointer
    let maxDepth: Int
    var index = 0
    var depth = 0

    init(bytes: UnsafeRawBufferPointer, maxDepth: Int) {
        self.bytes = bytes
        self.maxDepth = maxDepth
    }

    func fail(_ reason: JSONParseError.Reason) -> JSONParseError { JSONParseError(reason: reason, offset: index) }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    mutating func parseDocument() throws -> JSONValue {
        skipWhitespace()
        let value = try parseValue()
        skipWhitespace()
        guard index == bytes.count else { throw fail(.trailingData) }
        return value
    }

    mutating func parseValue() throws -> JSONValue {
        guard index < bytes.count else { throw fail(.unexpectedEnd) }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectLiteral("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectLiteral("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
        case let byte: throw fail(.unexpectedByte(byte))
        }
    }

    mutating func expectLiteral(_ literal: StaticString) throws {
        let count = literal.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw fail(.unexpectedEnd) }
        let base = literal.utf8Start
        for i in 0..<count where bytes[index + i] != base[i] {
            index += i
            throw fail(.unexpectedByte(bytes[index]))
        }
        index += count
    }

    mutating func enter() throws {
        depth += 1
        if depth > maxDepth { throw fail(.tooDeep(limit: maxDepth)) }
    }

    mutating func parseObject() throws -> JSONValue {
        try enter()
        index += 1
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            depth -= 1
            return .object(JSONObject())
        }
        return try gathering((key: String, value: JSONValue).self) { entries in
            // Where each key is, once the object has too many keys to scan for a duplicate: scanning for each key
            // would make an object of n keys cost n² / 2 comparisons (a 1 MiB request of 100,000 keys, minutes).
            var positions: [String: Int]?
            while true {
                skipWhitespace()
                guard index < bytes.count else { throw fail(.unexpectedEnd) }
                guard bytes[index] == UInt8(ascii: "\"") else { throw fail(.unexpectedByte(bytes[index])) }
                let key = try parseString()
                skipWhitespace()
                guard index < bytes.count else { throw fail(.unexpectedEnd) }
                guard bytes[index] == UInt8(ascii: ":") else { throw fail(.unexpectedByte(bytes[index])) }
                index += 1
                skipWhitespace()
                let value = try parseValue()
                // Duplicate keys: the last one wins, as in JavaScript and Ruby.
                let existing: Int?
                if let positions { existing = positions[key] } else { existing = entries.firstIndex { $0.key == key } }
                if let existing {
                    entries[existing] = (key, value)
                } else {
                    positions?[key] = entries.count
                    entries.append((key, value))
                    if positions == nil, entries.count > 16 {
                        positions = Dictionary(uniqueKeysWithValues: (0..<entries.count).map { (entries[$0].key, $0) })
                    }
                }
                skipWhitespace()
                guard index < bytes.count else { throw fail(.unexpectedEnd) }
                switch bytes[index] {
                case UInt8(ascii: ","): index += 1
                case UInt8(ascii: "}"):
                    index += 1
                    depth -= 1
                    return .object(JSONObject(uncheckedEntries: entries.take()))
                case let byte: throw fail(.unexpectedByte(byte))
                }
            }
        }
    }

    mutating func parseArray() throws -> JSONValue {
        try enter()
        index += 1
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            depth -= 1
            return .array([])
        }
        return try gathering(JSONValue.self) { elements in
            while true {
                skipWhitespace()
                elements.append(try parseValue())
                skipWhitespace()
                guard index < bytes.count else { throw fail(.unexpectedEnd) }
                switch bytes[index] {
                case UInt8(ascii: ","): index += 1
                case UInt8(ascii: "]"):
                    index += 1
                    depth -= 1
                    return .array(elements.take())
                case let byte: throw fail(.unexpectedByte(byte))
                }
            }
        }
    }

    mutating func parseNumber() throws -> JSONValue {
        let start = index
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count else { throw fail(.invalidNumber) }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else if isDigit(bytes[index]) {
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        } else {
            throw fail(.invalidNumber)
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail(.invalidNumber) }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail(.invalidNumber) }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        return .number(String(decoding: UnsafeRawBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self))
    }

    func isDigit(_ b: UInt8) -> Bool { b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") }

    /// Parses a string starting at the opening quote. Plain runs are validated as UTF-8 and copied in one go.
    mutating func parseString() throws -> String {
        index += 1
        let start = index
        // Fast path: no escapes.
        while index < bytes.count {
            let b = bytes[index]
            if b == UInt8(ascii: "\"") {
                let slice = UnsafeRawBufferPointer(rebasing: bytes[start..<index])
                guard let s = String(validating: slice, as: UTF8.self) else {
                    throw JSONParseError(reason: .invalidUTF8, offset: start)
                }
                index += 1
                return s
            }
            if b == UInt8(ascii: "\\") { break }
            if b < 0x20 { throw fail(.unexpectedByte(b)) }
            index += 1
        }
        guard index < bytes.count else { throw fail(.unexpectedEnd) }
        // Slow path with escapes.
        var out: [UInt8] = Array(UnsafeRawBufferPointer(rebasing: bytes[start..<index]))
        while index < bytes.count {
            let b = bytes[index]
            switch b {
            case UInt8(ascii: "\""):
                index += 1
                guard let s = String(validating: out, as: UTF8.self) else {
                    throw JSONParseError(reason: .invalidUTF8, offset: start)
                }
                return s
            case UInt8(ascii: "\\"):
                index += 1
                guard index < bytes.count else { throw fail(.unexpectedEnd) }
                let e = bytes[index]
                index += 1
                switch e {
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5C)
                case UInt8(ascii: "/"): out.append(0x2F)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try readHex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        // A high surrogate must be followed by an escaped low surrogate.
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                            bytes[index + 1] == UInt8(ascii: "u")
                        else { throw fail(.invalidEscape) }
                        index += 2
                        let low = try readHex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw fail(.invalidEscape) }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw fail(.invalidEscape)
                    }
                    guard let unicode = Unicode.Scalar(scalar) else { throw fail(.invalidEscape) }
                    out.append(contentsOf: Array(String(Character(unicode)).utf8))
                default:
                    throw fail(.invalidEscape)
                }
            default:
                if b < 0x20 { throw fail(.unexpectedByte(b)) }
                out.append(b)
                index += 1
            }
        }
        throw fail(.unexpectedEnd)
    }

    mutating func readHex4() throws -> UInt32 {
        guard index + 4 <= bytes.count else { throw fail(.unexpectedEnd) }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let b = bytes[index]
            let digit: UInt32
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(b - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(b - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(b - UInt8(ascii: "A") + 10)
            default: throw fail(.invalidEscape)
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }
}

/// The members of an object or array being parsed: the first `inlineCapacity` on the stack, then (all of them)
/// in an array that grows as before. A finished container of up to `inlineCapacity` members is one array of
/// exactly its size: an object of four keys costs one allocation, not three (an array appended to grows 1, 2,
/// 4), and holds no room it does not use.
private struct Gathered<Element> {
    static var inlineCapacity: Int { 8 }
    private let inline: UnsafeMutableBufferPointer<Element>
    private var inlineCount = 0
    private var spilled: [Element] = []

    init(inline: UnsafeMutableBufferPointer<Element>) {
        self.inline = inline
    }

    var count: Int { spilled.isEmpty ? inlineCount : spilled.count }

    subscript(i: Int) -> Element {
        get { spilled.isEmpty ? inline[i] : spilled[i] }
        set {
            if spilled.isEmpty { inline[i] = newValue } else { spilled[i] = newValue }
        }
    }

    func firstIndex(where matches: (Element) -> Bool) -> Int? {
        guard spilled.isEmpty else { return spilled.firstIndex(where: matches) }
        for i in 0..<inlineCount where matches(inline[i]) { return i }
        return nil
    }

    mutating func append(_ element: Element) {
        if spilled.isEmpty {
            if inlineCount < Self.inlineCapacity {
                (inline.baseAddress! + inlineCount).initialize(to: element)
                inlineCount += 1
                return
            }
            spilled.reserveCapacity(2 * Self.inlineCapacity)
            for i in 0..<inlineCount { spilled.append((inline.baseAddress! + i).move()) }
            inlineCount = 0
        }
        spilled.append(element)
    }

    /// The members, in order, as one array; nothing is left here.
    mutating func take() -> [Element] {
        if !spilled.isEmpty {
            defer { spilled = [] }
            return spilled
        }
        let count = inlineCount
        inlineCount = 0
        return Array(unsafeUninitializedCapacity: count) { buffer, initialized in
            buffer.baseAddress!.moveInitialize(from: inline.baseAddress!, count: count)
            initialized = count
        }
    }

    /// The members on the stack are let go (a container the parse left unfinished).
    mutating func release() {
        inline.baseAddress!.deinitialize(count: inlineCount)
        inlineCount = 0
    }
}

/// Runs `body` with a `Gathered` whose stack room lives as long as the call.
private func gathering<Element, Result>(
    _: Element.Type, _ body: (inout Gathered<Element>) throws -> Result
) rethrows -> Result {
    try withUnsafeTemporaryAllocation(of: Element.self, capacity: Gathered<Element>.inlineCapacity) { room in
        var gathered = Gathered(inline: room)
        defer { gathered.release() }
        return try body(&gathered)
    }
}
