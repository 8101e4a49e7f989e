import Bayeux
import NIOCore

/// One message of PostgreSQL's built-in logical decoding plugin, pgoutput, protocol version 1 (PostgreSQL's
/// "Logical Replication Message Formats"), as carried in the stream's XLogData. Values come in their text form.
enum PgOutputMessage: Sendable, Equatable {
    /// `finalLSN` is the position of the transaction's commit record (its start), the only position known before
    /// the commit message.
    case begin(finalLSN: LSN, commitTime: Int64, xid: UInt32)
    /// `endLSN` is the end of the commit record: the position a slot is confirmed to once the transaction is relayed.
    case commit(commitLSN: LSN, endLSN: LSN, commitTime: Int64)
    case origin(name: String)
    case relation(PgOutputRelation)
    case type(oid: UInt32, namespace: String, name: String)
    case insert(relation: UInt32, new: [PgOutputValue])
    /// `old` is the old key ('K', when the key changed) or the whole old row ('O', with `REPLICA IDENTITY FULL`).
    case update(relation: UInt32, old: [PgOutputValue]?, new: [PgOutputValue])
    case delete(relation: UInt32, old: [PgOutputValue])
    case truncate(relations: [UInt32])
    /// `pg_logical_emit_message`, when the stream asks for messages; ignored by the relay.
    case message

    /// Decodes one message (the whole of one XLogData's payload).
    static func decode(_ buffer: inout ByteBuffer) throws(RelayError) -> PgOutputMessage {
        guard let type = buffer.readInteger(as: UInt8.self) else { throw malformed("an empty message") }
        switch type {
        case UInt8(ascii: "B"):
            guard let final = buffer.readInteger(as: UInt64.self), let time = buffer.readInteger(as: Int64.self),
                let xid = buffer.readInteger(as: UInt32.self)
            else { throw malformed("a short Begin") }
            return .begin(finalLSN: LSN(final), commitTime: time, xid: xid)
        case UInt8(ascii: "C"):
            guard buffer.readInteger(as: UInt8.self) != nil, let commit = buffer.readInteger(as: UInt64.self),
                let end = buffer.readInteger(as: UInt64.self), let time = buffer.readInteger(as: Int64.self)
            else { throw malformed("a short Commit") }
            return .commit(commitLSN: LSN(commit), endLSN: LSN(end), commitTime: time)
        case UInt8(ascii: "O"):
            guard buffer.readInteger(as: UInt64.self) != nil, let name = buffer.readNullTerminatedString() else {
                throw malformed("a short Origin")
            }
            return .origin(name: name)
        case UInt8(ascii: "R"):
            guard let oid = buffer.readInteger(as: UInt32.self), let namespace = buffer.readNullTerminatedString(),
                let name = buffer.readNullTerminatedString(), let identity = buffer.readInteger(as: UInt8.self),
                let count = buffer.readInteger(as: Int16.self), count >= 0
            else { throw malformed("a short Relation") }
            var columns: [PgOutputRelation.Column] = []
            columns.reserveCapacity(Int(count))
            for _ in 0..<count {
                guard let flags = buffer.readInteger(as: UInt8.self), let column = buffer.readNullTerminatedString(),
                    let typeOID = buffer.readInteger(as: UInt32.self), buffer.readInteger(as: Int32.self) != nil
                else { throw malformed("a short Relation column") }
                columns.append(.init(name: column, typeOID: typeOID, isKey: flags & 1 != 0))
            }
            return .relation(
                PgOutputRelation(
                    oid: oid, namespace: namespace.isEmpty ? "pg_catalog" : namespace, name: name,
                    replicaIdentity: identity, columns: columns))
        case UInt8(ascii: "Y"):
            guard let oid = buffer.readInteger(as: UInt32.self), let namespace = buffer.readNullTerminatedString(),
                let name = buffer.readNullTerminatedString()
            else { throw malformed("a short Type") }
            return .type(oid: oid, namespace: namespace, name: name)
        case UInt8(ascii: "I"):
            guard let relation = buffer.readInteger(as: UInt32.self), buffer.readInteger(as: UInt8.self) == 0x4E
            else { throw malformed("an Insert without a new tuple") }
            return .insert(relation: relation, new: try tuple(&buffer))
        case UInt8(ascii: "U"):
            guard let relation = buffer.readInteger(as: UInt32.self), var kind = buffer.readInteger(as: UInt8.self)
            else { throw malformed("a short Update") }
            var old: [PgOutputValue]?
            if kind == UInt8(ascii: "K") || kind == UInt8(ascii: "O") {
                old = try tuple(&buffer)
                guard let next = buffer.readInteger(as: UInt8.self) else {
                    throw malformed("an Update without a new tuple")
                }
                kind = next
            }
            guard kind == UInt8(ascii: "N") else { throw malformed("an Update without a new tuple") }
            return .update(relation: relation, old: old, new: try tuple(&buffer))
        case UInt8(ascii: "D"):
            guard let relation = buffer.readInteger(as: UInt32.self), let kind = buffer.readInteger(as: UInt8.self),
                kind == UInt8(ascii: "K") || kind == UInt8(ascii: "O")
            else { throw malformed("a Delete without an old tuple") }
            return .delete(relation: relation, old: try tuple(&buffer))
        case UInt8(ascii: "T"):
            guard let count = buffer.readInteger(as: Int32.self), count >= 0, buffer.readInteger(as: UInt8.self) != nil
            else { throw malformed("a short Truncate") }
            var relations: [UInt32] = []
            for _ in 0..<count {
                guard let oid = buffer.readInteger(as: UInt32.self) else { throw malformed("a short Truncate") }
                relations.append(oid)
            }
            return .truncate(relations: relations)
        case UInt8(ascii: "M"):
            buffer.moveReaderIndex(to: buffer.writerIndex)
            return .message
        default:
            throw malformed("a message of unknown type \(type)")
        }
    }

    private static func tuple(_ buffer: inout ByteBuffer) throws(RelayError) -> [PgOutputValue] {
        guard let count = buffer.readInteger(as: Int16.self), count >= 0 else { throw malformed("a short tuple") }
        var values: [PgOutputValue] = []
        values.reserveCapacity(Int(count))
        for _ in 0..<count {
            switch buffer.readInteger(as: UInt8.self) {
            case UInt8(ascii: "n"):
                values.append(.null)
            case UInt8(ascii: "u"):
                values.append(.unchangedToast)
            case UInt8(ascii: "t"), UInt8(ascii: "b"):
                guard let length = buffer.readInteger(as: Int32.self), length >= 0,
                    let text = buffer.readString(length: Int(length))
                else { throw malformed("a short column value") }
                values.append(.text(text))
            default:
                throw malformed("a column value of unknown kind")
            }
        }
        return values
    }

    private static func malformed(_ what: String) -> RelayError {
        RelayError(.malformedWal2JSON, "pgoutput sent \(what)")
    }
}

/// A table as pgoutput describes it (sent before the first change of it in each connection, and again when it
/// changed).
struct PgOutputRelation: Sendable, Equatable {
    struct Column: Sendable, Equatable {
        var name: String
        var typeOID: UInt32
        /// Part of the replica identity (the primary key, or every column with `REPLICA IDENTITY FULL`).
        var isKey: Bool
    }

    var oid: UInt32
    var namespace: String
    var name: String
    /// `d` default (the primary key), `n` nothing, `f` full, `i` an index.
    var replicaIdentity: UInt8
    var columns: [Column]
}

/// One column's value in a pgoutput tuple.
enum PgOutputValue: Sendable, Equatable {
    case null
    /// A TOASTed value that the change did not touch: pgoutput does not send it (and wal2json leaves such a column
    /// out), so the relay leaves it out too.
    case unchangedToast
    case text(String)

    /// The value as wal2json writes it: numbers (`int2`, `int4`, `int8`, `oid`, `float4`, `float8`, `numeric`) as
    /// JSON numbers, NaN and the infinities as null; booleans as JSON booleans; `bytea` as its hex digits without
    /// `\x`; anything else (json and jsonb included) as a string of its text form. Nil for an unchanged TOAST value.
    func json(type oid: UInt32) -> JSONValue? {
        switch self {
        case .null: return .null
        case .unchangedToast: return nil
        case .text(let text):
            switch oid {
            case 20, 21, 23, 26, 700, 701, 1700:
                return Self.isFinite(text) ? .number(text) : .null
            case 16:
                return .bool(text == "t")
            case 17:
                return .string(text.hasPrefix("\\x") ? String(text.dropFirst(2)) : text)
            default:
                return .string(text)
            }
        }
    }

    /// Whether a number's text form is a finite number (not `NaN`, `Infinity` or `-Infinity`).
    private static func isFinite(_ text: String) -> Bool {
        guard let first = text.utf8.first else { return false }
        return first == UInt8(ascii: "-")
            ? text.utf8.dropFirst().first.map(Self.isDigitOrPoint) ?? false
            : Self.isDigitOrPoint(first)
    }

    private static func isDigitOrPoint(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || byte == UInt8(ascii: ".")
    }
}
