import Bayeux

/// Turns pgoutput messages into changes and batches, with the positions the wal2json relay gives them, so that a
/// transaction of any size is relayed in pieces and a relay restarted anywhere resumes exactly.
///
/// A change's position is `<commit end>:<index>`, as with wal2json. pgoutput sends the commit's end only with the
/// commit message, after the changes; a transaction's changes are therefore held until its commit (the server
/// sends a transaction only once it committed, so they follow each other at once). A transaction with more changes
/// than one batch holds cannot wait for its commit without holding all of it: its changes are positioned
/// `<commit start + 1>:<index>` instead (the start is in its begin message), and handed out as batches fill. Both
/// forms sort between the transactions before and after, and whether a transaction is large depends on it alone
/// (more than `limit` changes), so a replay after a restart positions every change as the first reading did. (A
/// commit end is 8-byte aligned and a commit start + 1 is odd: the two forms never meet at one LSN.)
struct PgOutputAssembler: Sendable {
    /// Everything up to here was handed out, is waiting in a batch, or was relayed before the assembler started.
    private(set) var after: PostgresPosition
    /// The most changes per batch.
    let limit: Int
    /// Each table's replica identity columns, or nil for `REPLICA IDENTITY FULL` (as for wal2json).
    var identityColumns: [String: [String]?] = [:]
    /// Each table's primary key columns, in key order: a row's id (pgoutput flags the replica identity's columns,
    /// which with `REPLICA IDENTITY FULL` are all of them).
    var primaryKeys: [String: [String]] = [:]
    /// The WAL position of the last message read, for the lag.
    private(set) var lastRead: LSN?

    private var relations: [UInt32: PgOutputRelation] = [:]
    private var open: Open?
    /// Changes with their positions, ready to go out, in order.
    private var ready: [(change: Change, position: PostgresPosition)] = []
    /// Everything up to here is in `ready` or was handed out: the position of a batch that takes all of `ready`.
    private var readyEnd: PostgresPosition
    /// The position of the last batch taken.
    private var handed: PostgresPosition

    private struct Open: Sendable {
        var start: LSN
        var xid: UInt32
        var index = 0
        /// The changes of a transaction that is not (yet) large, by index, until its commit gives their positions.
        var pending: [(index: Int, change: Change)] = []
        var large: Bool

        var largePosition: LSN { LSN(start.value &+ 1) }
        var extra: JSONObject { ["txn": .string(String(xid))] }
    }

    init(after: PostgresPosition, limit: Int) {
        self.after = after
        self.readyEnd = after
        self.handed = after
        self.limit = max(1, limit)
    }

    /// Whether a transaction is open (its begin read, its commit not yet).
    var isInsideTransaction: Bool { open != nil }

    /// Changes waiting to be taken, and held until their commit.
    var heldChanges: Int { ready.count + (open?.pending.count ?? 0) }

    mutating func feed(_ message: PgOutputMessage, at lsn: LSN) throws(RelayError) {
        lastRead = max(lastRead ?? lsn, lsn)
        switch message {
        case .begin(let final, _, let xid):
            let large = after.index != nil && after.lsn.value == final.value &+ 1
            open = Open(start: final, xid: xid, large: large)
        case .relation(let relation):
            relations[relation.oid] = relation
        case .insert(let oid, let new):
            let relation = try self.relation(oid)
            add(row(relation, .insert, columns: new, identity: nil))
        case .update(let oid, let old, let new):
            let relation = try self.relation(oid)
            add(row(relation, .update, columns: new, identity: old))
        case .delete(let oid, let old):
            let relation = try self.relation(oid)
            add(row(relation, .delete, columns: nil, identity: old))
        case .truncate(let oids):
            for oid in oids {
                let relation = try self.relation(oid)
                add(.truncate(relation))
            }
        case .commit(_, let end, _):
            guard let open else { throw RelayError(.malformedWal2JSON, "pgoutput sent a Commit without a Begin") }
            self.open = nil
            for (index, change) in open.pending {
                place(change, at: PostgresPosition(lsn: end, index: index), extra: open.extra)
            }
            let whole = PostgresPosition(lsn: end)
            if whole > after { after = whole }
            readyEnd = after
        case .origin, .type, .message:
            break
        }
    }

    /// The server said it sent everything before `lsn` (a keepalive): with no transaction open, nothing of the
    /// relayed tables lies before it that was not read, so the next batch may confirm it (a slot on a busy
    /// database whose relayed tables are quiet keeps up). Returns whether the position moved.
    @discardableResult
    mutating func progress(to lsn: LSN) -> Bool {
        let position = PostgresPosition(lsn: lsn)
        guard open == nil, position > after else { return false }
        after = position
        readyEnd = position
        return true
    }

    /// The next batch: `limit` changes once that many are ready; with `flush` (nothing more was read for now),
    /// whatever is ready, or only a position when it moved. Nil when there is nothing to hand out.
    mutating func batch(flush: Bool) -> ChangeBatch? {
        if ready.count >= limit {
            let taken = ready.prefix(limit)
            ready.removeFirst(limit)
            let position = ready.isEmpty ? readyEnd : taken.last!.position
            handed = position
            return ChangeBatch(changes: taken.map(\.change), position: position.description)
        }
        guard flush, !ready.isEmpty || readyEnd > handed else { return nil }
        let changes = ready.map(\.change)
        ready.removeAll(keepingCapacity: true)
        handed = readyEnd
        return ChangeBatch(changes: changes, position: readyEnd.description)
    }

    // MARK: -

    private enum Made {
        case row(Wal2JSONRecord.RowChange)
        case truncate(PgOutputRelation)
    }

    private mutating func add(_ made: Made) {
        guard var open else { return }
        open.index += 1
        let change: Change
        switch made {
        case .row(let row):
            change = row.change(seq: "", extra: open.extra, identityColumns: identityColumns)
        case .truncate(let relation):
            change = .truncate(schema: relation.namespace, table: relation.name, seq: "", extra: open.extra)
        }
        if open.large {
            place(change, at: PostgresPosition(lsn: open.largePosition, index: open.index), extra: open.extra)
            readyEnd = after
        } else {
            open.pending.append((open.index, change))
            if open.pending.count > limit {
                // Larger than a batch: its changes go out before its commit, positioned by its start.
                open.large = true
                for (index, held) in open.pending {
                    place(held, at: PostgresPosition(lsn: open.largePosition, index: index), extra: open.extra)
                }
                open.pending.removeAll()
                readyEnd = after
            }
        }
        self.open = open
    }

    /// Makes `change` ready at `position`, unless it was relayed before (a replay).
    private mutating func place(_ change: Change, at position: PostgresPosition, extra: JSONObject) {
        guard position > after else { return }
        var change = change
        change.seq = position.description
        ready.append((change, position))
        after = position
    }

    private func relation(_ oid: UInt32) throws(RelayError) -> PgOutputRelation {
        guard let relation = relations[oid] else {
            throw RelayError(.malformedWal2JSON, "pgoutput sent a change of relation \(oid) before describing it")
        }
        return relation
    }

    /// The row in wal2json's terms: the new row's columns, the old identity (the key's columns of a 'K' tuple,
    /// every column of an 'O' one), the primary key's names; unchanged TOAST values left out.
    private func row(
        _ relation: PgOutputRelation, _ operation: Change.Operation, columns new: [PgOutputValue]?,
        identity old: [PgOutputValue]?
    ) -> Made {
        let table = relation.namespace + "." + relation.name
        let full = relation.replicaIdentity == UInt8(ascii: "f")
        func columns(_ values: [PgOutputValue]?, keyOnly: Bool) -> [Wal2JSONRecord.Column] {
            guard let values else { return [] }
            var result: [Wal2JSONRecord.Column] = []
            result.reserveCapacity(values.count)
            for (column, value) in zip(relation.columns, values) where !keyOnly || column.isKey {
                guard let json = value.json(type: column.typeOID) else { continue }
                result.append(Wal2JSONRecord.Column(name: column.name, value: json))
            }
            return result
        }
        let key = primaryKeys[table] ?? (full ? [] : relation.columns.filter(\.isKey).map(\.name))
        return .row(
            Wal2JSONRecord.RowChange(
                operation: operation, schema: relation.namespace, table: relation.name,
                columns: columns(new, keyOnly: false), identity: columns(old, keyOnly: !full), primaryKey: key))
    }
}
