import Bayeux
import NIOCore
import Testing

@testable import PubSubRelay

/// pgoutput (protocol version 1) as PostgreSQL 15.20 wrote it for `pg_logical_slot_peek_binary_changes(…,
/// 'proto_version', '1', 'publication_names', 'gpub', 'messages', 'true')`, the same bytes a replication stream
/// carries in its XLogData: tables `g (id int primary key, owner text, big text, n numeric, b bool)` and `gf (id int
/// primary key, owner text)` with REPLICA IDENTITY FULL; an insert, an update, an update of the key, an insert, an
/// update and a delete on gf, an insert with a NULL and a NaN, a delete, a truncate and a logical message, each in
/// its own transaction.
@Suite struct PgOutputTests {
    static let recorded: [(lsn: String, hex: String)] = [
        ("0/15B8C28", "4200000000015b8d200003049d5447fb7d000002f8"),
        (
            "0/15B8C28",
            "520000401a7075626c69630067006400050169640000000017ffffffff006f776e65720000000019ffffffff006269670000000019ffffffff006e00000006a4ffffffff00620000000010ffffffff"
        ),
        (
            "0/15B8C28",
            "490000401a4e00057400000001317400000003616e6e740000000c686520736169642022686922740000000531322e3530740000000174"
        ),
        ("0/15B8D50", "430000000000015b8d2000000000015b8d500003049d5447fb7d"),
        ("0/15B8D50", "4200000000015b8db00003049d544800f4000002f9"),
        (
            "0/15B8D50",
            "550000401a4e00057400000001317400000003626f62740000000c686520736169642022686922740000000531322e3530740000000174"
        ),
        ("0/15B8DE0", "430000000000015b8db000000000015b8de00003049d544800f4"),
        ("0/15B8DE0", "4200000000015b8e900003049d54480432000002fa"),
        (
            "0/15B8DE0",
            "550000401a4b00057400000001316e6e6e6e4e00057400000001327400000003626f62740000000c686520736169642022686922740000000531322e3530740000000174"
        ),
        ("0/15B8EC0", "430000000000015b8e9000000000015b8ec00003049d54480432"),
        ("0/15B8EC0", "4200000000015b8f400003049d544806dd000002fb"),
        ("0/15B8EC0", "52000040217075626c6963006766006600020169640000000017ffffffff016f776e65720000000019ffffffff"),
        ("0/15B8EC0", "49000040214e00027400000001377400000003616e6e"),
        ("0/15B8F70", "430000000000015b8f4000000000015b8f700003049d544806dd"),
        ("0/15B8F70", "4200000000015b8fc80003049d5448096e000002fc"),
        ("0/15B8F70", "55000040214f00027400000001377400000003616e6e4e00027400000001377400000003636964"),
        ("0/15B8FF8", "430000000000015b8fc800000000015b8ff80003049d5448096e"),
        ("0/15B8FF8", "4200000000015b90400003049d54480b44000002fd"),
        ("0/15B8FF8", "44000040214f00027400000001377400000003636964"),
        ("0/15B9070", "430000000000015b904000000000015b90700003049d54480b44"),
        ("0/15B9070", "4200000000015b90f80003049d54480d76000002fe"),
        ("0/15B9070", "490000401a4e00057400000001336e74000000017874000000034e614e740000000166"),
        ("0/15B9128", "430000000000015b90f800000000015b91280003049d54480d76"),
        ("0/15B9128", "4200000000015b91680003049d54480ea2000002ff"),
        ("0/15B9128", "440000401a4b00057400000001336e6e6e6e"),
        ("0/15B9198", "430000000000015b916800000000015b91980003049d54480ea2"),
        ("0/15B9CC8", "4200000000015b9cf80003049d5448183300000300"),
        (
            "0/15B9CC8",
            "520000401a7075626c69630067006400050169640000000017ffffffff006f776e65720000000019ffffffff006269670000000019ffffffff006e00000006a4ffffffff00620000000010ffffffff"
        ),
        ("0/15B9CC8", "5400000001000000401a"),
        ("0/15B9E68", "430000000000015b9cf800000000015b9e680003049d54481833"),
        ("0/15B9EA8", "4200000000015b9ea80003049d54481df400000301"),
        ("0/15B9EA8", "4d0100000000015b9ea870000000000568656c6c6f"),
        ("0/15B9ED8", "430000000000015b9ea800000000015b9ed80003049d54481df4"),
    ]

    static func messages() throws -> [(LSN, PgOutputMessage)] {
        try recorded.map { row in
            var buffer = ByteBuffer(bytes: bytes(hex: row.hex))
            let message = try PgOutputMessage.decode(&buffer)
            #expect(buffer.readableBytes == 0, "\(message) left bytes unread")
            return (LSN(row.lsn)!, message)
        }
    }

    static func bytes(hex: String) -> [UInt8] {
        let digits = Array(hex.utf8)
        return stride(from: 0, to: digits.count, by: 2).map {
            UInt8(String(decoding: digits[$0..<$0 + 2], as: UTF8.self), radix: 16)!
        }
    }

    static func assembled(limit: Int = 100) throws -> (changes: [Change], ends: [LSN], last: ChangeBatch?) {
        var assembler = PgOutputAssembler(after: PostgresPosition(lsn: LSN(0)), limit: limit)
        assembler.identityColumns = ["public.g": ["id"], "public.gf": nil]
        assembler.primaryKeys = ["public.g": ["id"], "public.gf": ["id"]]
        var ends: [LSN] = []
        var changes: [Change] = []
        var last: ChangeBatch?
        for (lsn, message) in try messages() {
            if case .commit(_, let end, _) = message { ends.append(end) }
            try assembler.feed(message, at: lsn)
            if let batch = assembler.batch(flush: true) {
                changes += batch.changes
                last = batch
            }
        }
        return (changes, ends, last)
    }

    @Test func decodesEveryMessageOfTheRecording() throws {
        let messages = try Self.messages().map(\.1)
        #expect(messages.count == Self.recorded.count)
        guard case .relation(let g) = messages[1] else {
            Issue.record("no relation first")
            return
        }
        #expect(g.namespace == "public" && g.name == "g" && g.replicaIdentity == UInt8(ascii: "d"))
        #expect(g.columns.map(\.name) == ["id", "owner", "big", "n", "b"])
        #expect(g.columns.map(\.typeOID) == [23, 25, 25, 1700, 16])
        #expect(g.columns.map(\.isKey) == [true, false, false, false, false])
        #expect(messages.contains { if case .truncate(let oids) = $0 { oids == [g.oid] } else { false } })
        #expect(messages.contains(.message))
        let begins = messages.filter { if case .begin = $0 { true } else { false } }
        let commits = messages.filter { if case .commit = $0 { true } else { false } }
        #expect(begins.count == 10 && commits.count == 10)
        // The commit's position in the begin message is the commit record's start, before its end.
        for (begin, commit) in zip(begins, commits) {
            guard case .begin(let final, _, _) = begin, case .commit(let lsn, let end, _) = commit else { continue }
            #expect(final == lsn && final < end && end.value % 8 == 0)
        }
    }

    @Test func givesTheChangesWal2JSONGives() throws {
        let (changes, ends, last) = try Self.assembled()
        #expect(
            changes.map(\.operation) == [
                .insert, .update, .update, .insert, .update, .delete, .insert, .delete, .truncate,
            ])
        #expect(changes.map(\.id) == ["1", "1", "2", "7", "7", "7", "3", "3", nil])
        #expect(changes.map(\.collection.last!) == ["g", "g", "g", "gf", "gf", "gf", "g", "g", "g"])
        #expect(
            changes[0].document
                == [
                    "id": .number("1"), "owner": .string("ann"), "big": .string(#"he said "hi""#),
                    "n": .number("12.50"),
                    "b": .bool(true),
                ])
        // Key unchanged: the old key is the new one. Key changed: pgoutput's old key tuple.
        #expect(changes[1].previous == ["id": .number("1")])
        #expect(changes[2].previous == ["id": .number("1")] && changes[2].document?["id"] == .number("2"))
        // REPLICA IDENTITY FULL: the whole old row.
        #expect(changes[4].previous == ["id": .number("7"), "owner": .string("ann")])
        #expect(changes[5].document == ["id": .number("7"), "owner": .string("cid")])
        // NULL stays null; NaN is null as wal2json writes it; false is a boolean.
        #expect(changes[6].document?["owner"] == .null && changes[6].document?["n"] == .null)
        #expect(changes[6].document?["b"] == .bool(false))
        #expect(changes[7].document == ["id": .number("3")])
        // Each change at <its commit's end>:<index>, the transaction id beside it.
        for (change, end) in zip(changes, ends) {
            #expect(change.seq == "\(end):1")
            #expect(change.extra["txn"]?.stringValue != nil)
        }
        // The logical message's transaction moves the position on, with no change.
        #expect(last?.changes.isEmpty == true && last?.position == ends.last!.description)
    }
}
