import NIOCore

/// One RESP2 value, as Redis sends it.
public enum RESPValue: Sendable, Hashable {
    case simpleString(ByteBuffer)
    case error(String)
    case integer(Int64)
    /// nil is the null bulk string (`$-1`).
    case bulkString(ByteBuffer?)
    /// nil is the null array (`*-1`).
    case array([RESPValue]?)

    /// A simple or bulk string as text; nil for anything else.
    public var string: String? {
        switch self {
        case .simpleString(let b), .bulkString(let b?): return String(buffer: b)
        default: return nil
        }
    }

    /// The bytes of a simple or bulk string.
    public var buffer: ByteBuffer? {
        switch self {
        case .simpleString(let b), .bulkString(let b?): return b
        default: return nil
        }
    }

    /// An integer, or a string that holds one.
    public var int: Int64? {
        switch self {
        case .integer(let i): return i
        case .simpleString, .bulkString: return string.flatMap { Int64($0) }
        default: return nil
        }
    }

    public var array: [RESPValue]? {
        if case .array(let a?) = self { return a }
        return nil
    }

    public var isNull: Bool {
        switch self {
        case .bulkString(nil), .array(nil): return true
        default: return false
        }
    }
}

/// One argument of a command: always sent as a bulk string.
public enum RESPArgument: Sendable, Hashable, ExpressibleByStringLiteral, ExpressibleByIntegerLiteral {
    case string(String)
    case bytes(ByteBuffer)
    case integer(Int64)

    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .integer(value) }
}

/// A command: its name and arguments, each written as a RESP bulk string.
public struct RESPCommand: Sendable, Hashable, CustomStringConvertible {
    public var arguments: [RESPArgument]

    public init(_ arguments: [RESPArgument]) { self.arguments = arguments }
    public init(_ name: String, _ arguments: RESPArgument...) { self.arguments = [.string(name)] + arguments }

    /// The command name only: arguments may hold secrets (AUTH) or large payloads.
    public var description: String {
        if case .string(let name)? = arguments.first { return name }
        return "?"
    }
}
