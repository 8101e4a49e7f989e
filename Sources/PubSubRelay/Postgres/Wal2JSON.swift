import Bayeux

/// One row of wal2json's format-version 2 output (`pg_logical_slot_peek_changes(..., 'format-version', '2', ...)`).
public enum Wal2JSONRecord: Sendable, Equatable {
    public struct Column: Sendable, Equatable {
        public var name: String
        public var type: String?
        /// As wal2json wrote it: numbers and booleans as JSON, text as strings, NULL as null.
        public var value: JSONValue

        public init(name: String, type: String? = nil, value: JSONValue) {
            self.name = name
            self.type = type
            self.value = value
        }
    }

    public struct RowChange: Sendable, Equatable {
        public var operation: Change.Operation
        public var schema: String
        public var table: String
        /// The new row (insert, update).
        public var columns: [Column]
        /// The old row's replica identity (update, delete): the primary key, or the whole row with
        /// `REPLICA IDENTITY FULL`.
        public var identity: [Column]
        /// The primary key's column names (`include-pk`), in key order.
        public var primaryKey: [String]
    }

    /// `nextLSN` is the end of the transaction's commit record (wal2json writes it on the begin row too with
    /// `include-lsn`, decoding a transaction only once it committed): every change's position is known before its
    /// commit row is read.
    case begin(xid: String?, nextLSN: LSN?)
    /// `nextLSN` is the commit record's end: the position to confirm once the transaction is relayed.
    case commit(xid: String?, nextLSN: LSN?)
    case row(RowChange)
    case truncate(schema: String, table: String)
    /// `pg_logical_emit_message` output; ignored by the relay.
    case message

    /// Parses one `data` column.
    public static func parse(_ text: String) throws(RelayError) -> Wal2JSONRecord {
        let value: JSONValue
        do {
            value = try JSONParser(maxDepth: 32).parse(text)
        } catch {
            throw RelayError(.malformedWal2JSON, "wal2json row is not JSON: \(error)")
        }
        guard let object = value.objectValue, let action = object["action"]?.stringValue else {
            throw RelayError(.malformedWal2JSON, "wal2json row has no action (format-version 2 expected)")
        }
        let xid = object["xid"].flatMap { $0.stringValue ?? ($0.integerValue.map { String($0) }) }
        switch action {
        case "B":
            return .begin(xid: xid, nextLSN: object["nextlsn"]?.stringValue.flatMap { LSN($0) })
        case "C":
            return .commit(xid: xid, nextLSN: object["nextlsn"]?.stringValue.flatMap { LSN($0) })
        case "I", "U", "D":
            guard let schema = object["schema"]?.stringValue, let table = object["table"]?.stringValue else {
                throw RelayError(.malformedWal2JSON, "wal2json \(action) row without schema or table")
            }
            let operation: Change.Operation = action == "I" ? .insert : action == "U" ? .update : .delete
            return .row(
                RowChange(
                    operation: operation, schema: schema, table: table,
                    columns: try columns(object["columns"]), identity: try columns(object["identity"]),
                    primaryKey: try columns(object["pk"]).map(\.name)))
        case "T":
            guard let schema = object["schema"]?.stringValue, let table = object["table"]?.stringValue else {
                throw RelayError(.malformedWal2JSON, "wal2json T row without schema or table")
            }
            return .truncate(schema: schema, table: table)
        case "M":
            return .message
        default:
            throw RelayError(.malformedWal2JSON, "wal2json row with unknown action \(action)")
        }
    }

    private static func columns(_ value: JSONValue?) throws(RelayError) -> [Column] {
        guard let value, !value.isNull else { return [] }
        guard let array = value.arrayValue else {
            throw RelayError(.malformedWal2JSON, "wal2json columns are not an array")
        }
        var result: [Column] = []
        result.reserveCapacity(array.count)
        for element in array {
            guard let object = element.objectValue, let name = object["name"]?.stringValue else {
                throw RelayError(.malformedWal2JSON, "wal2json column without a name")
            }
            result.append(Column(name: name, type: object["type"]?.stringValue, value: object["value"] ?? .null))
        }
        return result
    }
}

extension Wal2JSONRecord.RowChange {
    /// The row's id: the primary key's value as text (a number or boolean as written, a string as is); a
    /// composite key as the JSON array of its values. Falls back to the whole identity when no key is known.
    public var id: String {
        let keyNames = primaryKey.isEmpty ? (identity.isEmpty ? columns : identity).map(\.name) : primaryKey
        let source = operation == .delete || columns.isEmpty ? identity : columns
        let values: [JSONValue] = keyNames.map { name in
            source.first { $0.name == name }?.value
                ?? identity.first { $0.name == name }?.value ?? .null
        }
        if values.count == 1 {
            switch values[0] {
            case .string(let text): return text
            case .number(let text): return text
            case .bool(let flag): return flag ? "true" : "false"
            case .null: return ""
            default: return values[0].jsonString
            }
        }
        return JSONValue.array(values).jsonString
    }

    /// The old row's values as far as its replica identity holds them (update, delete): every column with
    /// `REPLICA IDENTITY FULL`, the key's otherwise; nil for an insert or when wal2json gave none.
    public var previous: JSONObject? {
        guard operation != .insert, !identity.isEmpty else { return nil }
        var object = JSONObject()
        for column in identity { object[column.name] = column.value }
        return object
    }

    /// The change this row makes, at `seq`. `identityColumns` are each table's replica identity columns (nil for
    /// `REPLICA IDENTITY FULL`): an update whose identity did not change carries no old identity, and its
    /// `previous` is then made of those columns' new values, which are also their old ones.
    func change(seq: String, extra: JSONObject, identityColumns: [String: [String]?]) -> Change {
        var previous = self.previous
        if previous == nil, operation == .update, case let columns?? = identityColumns[schema + "." + table] {
            var unchanged = JSONObject()
            for column in self.columns where columns.contains(column.name) { unchanged[column.name] = column.value }
            previous = unchanged
        }
        return Change(
            collection: [schema, table], id: id, operation: operation, seq: seq, document: document, extra: extra,
            previous: previous)
    }

    /// The row as an object: the new row for insert/update, the old identity for delete.
    public var document: JSONObject {
        var object = JSONObject()
        for column in (operation == .delete ? identity : columns) { object[column.name] = column.value }
        return object
    }
}

/// A position in the slot's feed: after the whole transaction whose commit record ends at `lsn`, or, with `index`,
/// after that transaction's first `index` changes only. Written `X/Y` or `X/Y:index`: the checkpoint of a relay
/// stopped in the middle of a large transaction points inside it.
public struct PostgresPosition: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var lsn: LSN
    /// The changes of the transaction relayed so far, nil for all of them.
    public var index: Int?

    public init(lsn: LSN, index: Int? = nil) {
        self.lsn = lsn
        self.index = index
    }

    public init?(_ text: some StringProtocol) {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count <= 2, let lsn = LSN(parts[0]) else { return nil }
        self.lsn = lsn
        if parts.count == 2 {
            guard let index = Int(parts[1]), index >= 0 else { return nil }
            self.index = index
        }
    }

    public var description: String { index.map { "\(lsn):\($0)" } ?? lsn.description }

    /// Whether it follows a whole transaction (the slot may be advanced to it).
    public var isWholeTransaction: Bool { index == nil }

    public static func < (lhs: PostgresPosition, rhs: PostgresPosition) -> Bool {
        (lhs.lsn, lhs.index ?? .max) < (rhs.lsn, rhs.index ?? .max)
    }
}

/// Turns wal2json rows into changes one at a time, so that a transaction of any size is relayed in pieces: each
/// change carries its position (`<commit end LSN>:<index>`), known from the begin row. Skips every change at or
/// below `after` (a slot replays from its last persisted position after a server crash, and from the start of a
/// transaction the relay had relayed only in part).
public struct Wal2JSONAssembler: Sendable {
    /// What one row gives.
    public enum Event: Sendable, Equatable {
        case change(Change)
        /// A transaction above `after` ended (even one without relayed changes, DDL): `position` may be confirmed.
        case commit(PostgresPosition)
    }

    /// Everything up to here was handed out (or was relayed before the assembler started).
    public private(set) var after: PostgresPosition
    /// The open transaction's commit end and id, nil between transactions.
    private var end: LSN?
    private var xid: String?
    private var index = 0
    /// The WAL position of the last row read, for the lag.
    public private(set) var lastRead: LSN?
    /// Each table's replica identity columns (`public.notes` → `["id"]`), or nil for `REPLICA IDENTITY FULL`.
    /// wal2json gives an update's old identity only when it changed; when it did not, those columns' old values
    /// are the new ones, and `previous` is made of them.
    public var identityColumns: [String: [String]?] = [:]

    public init(after: PostgresPosition) { self.after = after }

    public init(after: LSN) { self.init(after: PostgresPosition(lsn: after)) }

    /// Feeds one peeked row (`lsn` is the function's `lsn` column); returns the change it holds, or the commit that
    /// ends a transaction, when above `after`.
    public mutating func feed(lsn: LSN, data: String) throws(RelayError) -> Event? {
        lastRead = lsn
        let record = try Wal2JSONRecord.parse(data)
        switch record {
        case .begin(let xid, let nextLSN):
            guard let nextLSN else {
                throw RelayError(.malformedWal2JSON, "wal2json begin row without nextlsn (include-lsn is required)")
            }
            self.end = nextLSN
            self.xid = xid
            index = 0
            return nil
        case .commit(_, let nextLSN):
            guard let end = end ?? nextLSN else { return nil }
            defer {
                self.end = nil
                self.xid = nil
            }
            let position = PostgresPosition(lsn: end)
            guard position > after else { return nil }
            after = position
            return .commit(position)
        case .row(let row):
            guard let position = nextPosition() else { return nil }
            return .change(row.change(seq: position.description, extra: extra, identityColumns: identityColumns))
        case .truncate(let schema, let table):
            guard let position = nextPosition() else { return nil }
            return .change(Change.truncate(schema: schema, table: table, seq: position.description, extra: extra))
        case .message:
            return nil
        }
    }

    /// Counts a change of the open transaction; its position when it is above `after` (then it is handed out).
    private mutating func nextPosition() -> PostgresPosition? {
        guard let end else { return nil }
        index += 1
        let position = PostgresPosition(lsn: end, index: index)
        guard position > after else { return nil }
        after = position
        return position
    }

    private var extra: JSONObject { xid.map { ["txn": .string($0)] } ?? [:] }

    /// Whether a transaction is open (its begin seen, its commit not yet).
    public var isInsideTransaction: Bool { end != nil }
}

extension Change {
    /// A truncate of `schema.table`: to the collection's channel, with no id.
    static func truncate(schema: String, table: String, seq: String, extra: JSONObject) -> Change {
        Change(collection: [schema, table], id: nil, operation: .truncate, seq: seq, extra: extra)
    }
}
