/// A JSON value as it travelled on the wire.
///
/// Numbers keep their original text, so a payload is forwarded exactly as the publisher wrote it
/// (no `Double` rounding of large integers). Objects keep their key order.
public enum JSONValue: Sendable, Hashable {
    case null
    case bool(Bool)
    case number(String)
    case string(String)
    case array([JSONValue])
    case object(JSONObject)

    public init(_ int: Int) { self = .number(String(int)) }

    public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    public var objectValue: JSONObject? {
        if case .object(let o) = self { return o }
        return nil
    }

    public var arrayValue: [JSONValue]? {
        if case .array(let a) = self { return a }
        return nil
    }

    /// The value as an integer, from a JSON number or a numeric string (PrivatePub timestamps come as both).
    public var integerValue: Int64? {
        switch self {
        case .number(let text), .string(let text):
            if let i = Int64(text) { return i }
            if let d = Double(text), d.isFinite, abs(d) < 9.0e18 { return Int64(d) }
            return nil
        default:
            return nil
        }
    }

    public var doubleValue: Double? {
        if case .number(let text) = self { return Double(text) }
        return nil
    }

    public var isNull: Bool {
        if case .null = self { return true }
        return false
    }
}

/// A JSON object that keeps its key order. Bayeux messages have a handful of keys, so lookups scan.
public struct JSONObject: Sendable, Hashable, ExpressibleByDictionaryLiteral {
    public private(set) var entries: [(key: String, value: JSONValue)]

    public init() { entries = [] }

    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        entries = []
        entries.reserveCapacity(elements.count)
        for (k, v) in elements { self[k] = v }
    }

    init(uncheckedEntries: [(key: String, value: JSONValue)]) { entries = uncheckedEntries }

    public var count: Int { entries.count }
    public var isEmpty: Bool { entries.isEmpty }
    public var keys: [String] { entries.map(\.key) }

    public subscript(key: String) -> JSONValue? {
        get {
            for entry in entries where entry.key == key { return entry.value }
            return nil
        }
        set {
            if let index = entries.firstIndex(where: { $0.key == key }) {
                if let newValue { entries[index].value = newValue } else { entries.remove(at: index) }
            } else if let newValue {
                entries.append((key, newValue))
            }
        }
    }

    public func contains(_ key: String) -> Bool { entries.contains { $0.key == key } }

    public mutating func reserveCapacity(_ minimumCapacity: Int) { entries.reserveCapacity(minimumCapacity) }

    public static func == (lhs: JSONObject, rhs: JSONObject) -> Bool {
        guard lhs.entries.count == rhs.entries.count else { return false }
        for entry in lhs.entries where rhs[entry.key] != entry.value { return false }
        return true
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(entries.count)
        for entry in entries.sorted(by: { $0.key < $1.key }) {
            hasher.combine(entry.key)
            hasher.combine(entry.value)
        }
    }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByArrayLiteral, ExpressibleByNilLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int) { self = .number(String(value)) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(nilLiteral: ()) { self = .null }
}
