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

    case begin(xid: String?)
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
            return .begin(xid: xid)
        case "C":
            return .commit(xid: xid, nextLSN: object["nextlsn"]?.stringValue.flatMap { LSN($0) })
        case "I", "U", "D":
            guard let schema = object["schema"]?.stringValue, let table = object["table"]?.stringValue else {
                throw RelayError(.malformedWal2JSON, "wal2json \(action) row without schema or table")
            }
            let operation: Change.Operation = action == "I" ? .insert : action == "U" ? .update : .delete
            return .row(RowChange(
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

    /// The row as an object: the new row for insert/update, the old identity for delete.
    public var document: JSONObject {
        var object = JSONObject()
        for column in (operation == .delete ? identity : columns) { object[column.name] = column.value }
        return object
    }
}

/// Groups wal2json rows into whole transactions and turns them into change batches, skipping every transaction
/// that ends at or below `after` (a slot replays from its last persisted position after a server crash).
public struct Wal2JSONAssembler: Sendable {
    public private(set) var after: LSN
    private var pending: [Change] = []
    private var xid: String?
    private var inTransaction = false
    private var index = 0
    /// Each table's replica identity columns (`public.notes` → `["id"]`), or nil for `REPLICA IDENTITY FULL`.
    /// wal2json gives an update's old identity only when it changed; when it did not, those columns' old values
    /// are the new ones, and `previous` is made of them.
    public var identityColumns: [String: [String]?] = [:]

    public init(after: LSN) { self.after = after }

    /// Feeds one peeked row (`lsn` is the function's `lsn` column); returns a batch when it completes a
    /// transaction above `after`.
    public mutating func feed(lsn: LSN, data: String) throws(RelayError) -> ChangeBatch? {
        let record = try Wal2JSONRecord.parse(data)
        switch record {
        case .begin(let xid):
            self.xid = xid
            pending = []
            index = 0
            inTransaction = true
            return nil
        case .commit(let xid, let nextLSN):
            // The commit row's own lsn column is the commit record's end, as is nextlsn.
            let end = nextLSN ?? lsn
            defer { pending = []; inTransaction = false; self.xid = nil }
            guard end > after else { return nil }
            after = end
            let changes = pending.map { change -> Change in
                var change = change
                change.seq = end.description + ":" + change.seq
                if let xid = xid ?? self.xid { change.extra["txn"] = .string(xid) }
                return change
            }
            return ChangeBatch(changes: changes, position: end.description)
        case .row(let row):
            index += 1
            var previous = row.previous
            if previous == nil, row.operation == .update, case let columns?? = identityColumns[row.schema + "." + row.table] {
                var unchanged = JSONObject()
                for column in row.columns where columns.contains(column.name) { unchanged[column.name] = column.value }
                previous = unchanged
            }
            pending.append(Change(
                collection: [row.schema, row.table], id: row.id, operation: row.operation, seq: String(index),
                document: row.document, previous: previous))
            return nil
        case .truncate(let schema, let table):
            index += 1
            pending.append(Change(collection: [schema, table], id: nil, operation: .truncate, seq: String(index)))
            return nil
        case .message:
            return nil
        }
    }

    /// Whether a transaction is open (rows seen after its begin, commit not yet seen).
    public var isInsideTransaction: Bool { inTransaction }
}
