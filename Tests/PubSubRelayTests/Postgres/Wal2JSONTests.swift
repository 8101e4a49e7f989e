import Bayeux
import Testing

@testable import PubSubRelay

/// Rows as wal2json 2.5 (format-version 2, include-pk, include-lsn, include-transaction) prints them.
@Suite struct Wal2JSONTests {
    static let begin726 =
        #"{"action":"B","xid":726,"timestamp":"2026-11-22 10:46:55.2935+00","lsn":"0/1527248","nextlsn":"0/1527278"}"#
    static let insertN1 =
        #"{"action":"I","xid":726,"lsn":"0/1527160","schema":"public","table":"notes","columns":[{"name":"id","type":"text","value":"n1"},{"name":"body","type":"text","value":"hello"},{"name":"rev","type":"integer","value":1}],"pk":[{"name":"id","type":"text"}]}"#
    static let commit726 =
        #"{"action":"C","xid":726,"timestamp":"2026-11-22 10:46:55.2935+00","lsn":"0/1527248","nextlsn":"0/1527278"}"#
    static let update =
        #"{"action":"U","xid":727,"lsn":"0/1527300","schema":"public","table":"notes","columns":[{"name":"id","type":"text","value":"n1"},{"name":"body","type":"text","value":"hello!"},{"name":"rev","type":"integer","value":2}],"identity":[{"name":"id","type":"text","value":"n1"}],"pk":[{"name":"id","type":"text"}]}"#
    static let delete =
        #"{"action":"D","xid":728,"lsn":"0/1527398","schema":"public","table":"notes","identity":[{"name":"id","type":"text","value":"n2"},{"name":"body","type":"text","value":"world"}],"pk":[{"name":"id","type":"text"}]}"#

    @Test func lsn() {
        #expect(LSN("0/1527278")?.value == 0x1527278)
        #expect(LSN("16/B374D848")?.value == 0x16_B374_D848)
        #expect(LSN("16/B374D848")?.description == "16/B374D848")
        #expect(LSN("0/0") == LSN(0))
        #expect(LSN("1527278") == nil)
        #expect(LSN("x/1") == nil)
        #expect(LSN("0/123456789") == nil)
        #expect(LSN("1/0")! > LSN("0/FFFFFFFF")!)
    }

    @Test func parsesEachAction() throws {
        #expect(try Wal2JSONRecord.parse(Self.begin726) == .begin(xid: "726", nextLSN: LSN("0/1527278")))
        #expect(try Wal2JSONRecord.parse(Self.commit726) == .commit(xid: "726", nextLSN: LSN("0/1527278")))
        guard case .row(let insert) = try Wal2JSONRecord.parse(Self.insertN1) else {
            Issue.record("not a row")
            return
        }
        #expect(insert.operation == .insert)
        #expect(insert.schema == "public" && insert.table == "notes")
        #expect(insert.primaryKey == ["id"])
        #expect(insert.id == "n1")
        #expect(insert.document == ["id": "n1", "body": "hello", "rev": .number("1")])
        guard case .row(let delete) = try Wal2JSONRecord.parse(Self.delete) else {
            Issue.record("not a row")
            return
        }
        #expect(delete.operation == .delete)
        #expect(delete.id == "n2")
        #expect(delete.document["body"] == "world")
        #expect(
            try Wal2JSONRecord.parse(#"{"action":"T","xid":9,"schema":"public","table":"notes"}"#)
                == .truncate(schema: "public", table: "notes"))
        #expect(
            try Wal2JSONRecord.parse(#"{"action":"M","transactional":false,"prefix":"p","content":"x"}"#) == .message)
    }

    @Test func idsOfNumericAndCompositeKeys() throws {
        let numeric =
            #"{"action":"I","schema":"s","table":"t","columns":[{"name":"k","type":"bigint","value":42},{"name":"v","type":"text","value":null}],"pk":[{"name":"k","type":"bigint"}]}"#
        guard case .row(let row) = try Wal2JSONRecord.parse(numeric) else {
            Issue.record("not a row")
            return
        }
        #expect(row.id == "42")
        let composite =
            #"{"action":"D","schema":"s","table":"t","identity":[{"name":"a","type":"text","value":"x"},{"name":"b","type":"integer","value":7}],"pk":[{"name":"a","type":"text"},{"name":"b","type":"integer"}]}"#
        guard case .row(let row2) = try Wal2JSONRecord.parse(composite) else {
            Issue.record("not a row")
            return
        }
        #expect(row2.id == #"["x",7]"#)
    }

    @Test func refusesWhatIsNotVersion2() {
        expectRelayError(.malformedWal2JSON) { try Wal2JSONRecord.parse(#"{"change":[]}"#) }
        expectRelayError(.malformedWal2JSON) { try Wal2JSONRecord.parse("not json") }
        expectRelayError(.malformedWal2JSON) { try Wal2JSONRecord.parse(#"{"action":"I","columns":[]}"#) }
        expectRelayError(.malformedWal2JSON) { try Wal2JSONRecord.parse(#"{"action":"Z"}"#) }
    }

    static func change(_ event: Wal2JSONAssembler.Event?) -> Change? {
        if case .change(let change)? = event { return change }
        return nil
    }

    @Test func positions() {
        #expect(PostgresPosition("0/1527278") == PostgresPosition(lsn: LSN(0x1527278)))
        #expect(PostgresPosition("0/1527278:42") == PostgresPosition(lsn: LSN(0x1527278), index: 42))
        #expect(PostgresPosition("0/1527278:42")?.description == "0/1527278:42")
        #expect(PostgresPosition("0/1527278:x") == nil)
        #expect(PostgresPosition("0/1527278:-1") == nil)
        #expect(PostgresPosition("0/1:2:3") == nil)
        // Inside a transaction comes before its end, and after every transaction that ended before it.
        #expect(PostgresPosition("0/20:5")! < PostgresPosition("0/20")!)
        #expect(PostgresPosition("0/20:5")! < PostgresPosition("0/20:6")!)
        #expect(PostgresPosition("0/1F")! < PostgresPosition("0/20:1")!)
    }

    @Test func handsOutEachChangeAsItIsReadAndSkipsReplays() throws {
        var assembler = Wal2JSONAssembler(after: LSN(0))
        #expect(try assembler.feed(lsn: LSN("0/1527160")!, data: Self.begin726) == nil)
        #expect(assembler.isInsideTransaction)
        let change = try #require(Self.change(try assembler.feed(lsn: LSN("0/1527160")!, data: Self.insertN1)))
        #expect(change.seq == "0/1527278:1")
        #expect(change.extra["txn"] == "726")
        #expect(change.collection == ["public", "notes"])
        #expect(assembler.after == PostgresPosition("0/1527278:1"))
        #expect(
            try assembler.feed(lsn: LSN("0/1527278")!, data: Self.commit726)
                == .commit(PostgresPosition(lsn: LSN("0/1527278")!)))
        #expect(!assembler.isInsideTransaction)

        // Replayed by a rewound slot: skipped.
        #expect(try assembler.feed(lsn: LSN("0/1527160")!, data: Self.begin726) == nil)
        #expect(try assembler.feed(lsn: LSN("0/1527160")!, data: Self.insertN1) == nil)
        #expect(try assembler.feed(lsn: LSN("0/1527278")!, data: Self.commit726) == nil)
        #expect(assembler.after == PostgresPosition("0/1527278"))

        // An empty transaction (DDL) still moves the position.
        #expect(
            try assembler.feed(lsn: LSN("0/1528000")!, data: #"{"action":"B","xid":730,"nextlsn":"0/1528100"}"#) == nil)
        #expect(
            try assembler.feed(lsn: LSN("0/1528100")!, data: #"{"action":"C","xid":730,"nextlsn":"0/1528100"}"#)
                == .commit(PostgresPosition("0/1528100")!))
    }

    /// The begin row's nextlsn names every change's position before the commit is read; without it (no
    /// include-lsn) a transaction could only be relayed whole.
    @Test func refusesABeginWithoutItsCommitPosition() {
        var assembler = Wal2JSONAssembler(after: LSN(0))
        expectRelayError(.malformedWal2JSON) { try assembler.feed(lsn: LSN(1), data: #"{"action":"B","xid":730}"#) }
    }

    @Test func assemblerStartingAfterACheckpointSkipsEverythingBelow() throws {
        var assembler = Wal2JSONAssembler(after: LSN("0/1527278")!)
        _ = try assembler.feed(lsn: LSN("0/1527160")!, data: Self.begin726)
        #expect(try assembler.feed(lsn: LSN("0/1527160")!, data: Self.insertN1) == nil)
        #expect(try assembler.feed(lsn: LSN("0/1527278")!, data: Self.commit726) == nil)
        _ = try assembler.feed(lsn: LSN("0/1527300")!, data: #"{"action":"B","xid":727,"nextlsn":"0/1527390"}"#)
        let update = try #require(Self.change(try assembler.feed(lsn: LSN("0/1527300")!, data: Self.update)))
        let truncate = try #require(
            Self.change(
                try assembler.feed(
                    lsn: LSN("0/1527300")!, data: #"{"action":"T","xid":727,"schema":"public","table":"notes"}"#)))
        #expect([update.operation, truncate.operation] == [.update, .truncate])
        #expect([update.seq, truncate.seq] == ["0/1527390:1", "0/1527390:2"])
        #expect(truncate.id == nil)
        #expect(
            try assembler.feed(lsn: LSN("0/1527390")!, data: #"{"action":"C","xid":727,"nextlsn":"0/1527390"}"#)
                == .commit(PostgresPosition("0/1527390")!))
    }

    /// A relay stopped in the middle of a transaction resumes after the last change it checkpointed: the slot
    /// replays the transaction from its begin, the assembler skips the changes up to the index.
    @Test func resumesInsideATransaction() throws {
        var assembler = Wal2JSONAssembler(after: PostgresPosition("0/1527390:1")!)
        _ = try assembler.feed(lsn: LSN("0/1527160")!, data: Self.begin726)
        #expect(try assembler.feed(lsn: LSN("0/1527160")!, data: Self.insertN1) == nil)
        #expect(try assembler.feed(lsn: LSN("0/1527278")!, data: Self.commit726) == nil)
        _ = try assembler.feed(lsn: LSN("0/1527300")!, data: #"{"action":"B","xid":727,"nextlsn":"0/1527390"}"#)
        #expect(try assembler.feed(lsn: LSN("0/1527300")!, data: Self.update) == nil)
        let truncate = try #require(
            Self.change(
                try assembler.feed(
                    lsn: LSN("0/1527300")!, data: #"{"action":"T","xid":727,"schema":"public","table":"notes"}"#)))
        #expect(truncate.seq == "0/1527390:2")
        #expect(truncate.extra["txn"] == "727")
        #expect(
            try assembler.feed(lsn: LSN("0/1527390")!, data: #"{"action":"C","xid":727,"nextlsn":"0/1527390"}"#)
                == .commit(PostgresPosition("0/1527390")!))
    }

    /// An update's and a delete's old values, for routes: the identity wal2json gave; when it gave none (the key
    /// did not change), the identity columns' new values, which are then the old ones too.
    @Test func previousValuesOfUpdatesAndDeletes() throws {
        guard case .row(let update) = try Wal2JSONRecord.parse(Self.update),
            case .row(let delete) = try Wal2JSONRecord.parse(Self.delete),
            case .row(let insert) = try Wal2JSONRecord.parse(Self.insertN1)
        else {
            Issue.record("not rows")
            return
        }
        #expect(update.previous == ["id": "n1"])
        #expect(delete.previous == ["id": "n2", "body": "world"])
        #expect(insert.previous == nil)

        let noIdentity =
            #"{"action":"U","schema":"public","table":"notes","columns":[{"name":"id","type":"text","value":"n1"},{"name":"owner","type":"text","value":"a"}]}"#
        var assembler = Wal2JSONAssembler(after: LSN(0))
        assembler.identityColumns = ["public.notes": ["id", "owner"]]
        _ = try assembler.feed(lsn: LSN("0/1")!, data: #"{"action":"B","xid":1,"nextlsn":"0/2"}"#)
        let change = try #require(Self.change(try assembler.feed(lsn: LSN("0/1")!, data: noIdentity)))
        #expect(change.previous == ["id": "n1", "owner": "a"])

        var full = Wal2JSONAssembler(after: LSN(0))
        let everyColumn: [String]? = nil  // REPLICA IDENTITY FULL
        full.identityColumns = ["public.notes": everyColumn]
        _ = try full.feed(lsn: LSN("0/1")!, data: #"{"action":"B","xid":1,"nextlsn":"0/2"}"#)
        let unknown = try #require(Self.change(try full.feed(lsn: LSN("0/1")!, data: noIdentity)))
        #expect(unknown.previous == nil)
    }

    /// A full resync pages by key: the first page from the start, each next one after the last key sent, cast
    /// back to the key's types; a table without a primary key pages by ctid.
    @Test func resyncPagesByKeyNeverByOffset() {
        let key = ResyncKey(names: ["org", "Id"], types: ["text", "integer"])
        #expect(
            key.pageSQL(of: #""public"."notes""#, after: nil, limit: 10).sql
                == #"SELECT row_to_json(t.*)::text, t."org"::text, t."Id"::text FROM ONLY "public"."notes" t ORDER BY t."org", t."Id" LIMIT 10"#
        )
        let next = key.pageSQL(of: #""public"."notes""#, after: ["o'1", "7"], limit: 10)
        #expect(
            next.sql
                == #"SELECT row_to_json(t.*)::text, t."org"::text, t."Id"::text FROM ONLY "public"."notes" t WHERE (t."org", t."Id") > (CAST($1 AS text), CAST($2 AS integer)) ORDER BY t."org", t."Id" LIMIT 10"#
        )
        #expect(next.binds == ["o'1", "7"])
        #expect(!next.sql.contains("OFFSET"))
        let physical = ResyncKey(names: [], types: []).pageSQL(of: "s.t", after: ["(0,5)"], limit: 3)
        #expect(
            physical.sql
                == "SELECT row_to_json(t.*)::text, t.ctid::text FROM ONLY s.t t WHERE (t.ctid) > (CAST($1 AS tid)) ORDER BY t.ctid LIMIT 3"
        )
    }

    /// The start check: routed columns must be in the table and in its replica identity, else one line that names
    /// the table, the columns and the SQL that fixes it.
    @Test func replicaIdentityProblems() {
        typealias Identity = PostgresChangeSource.ReplicaIdentity
        let byKey = Identity(kind: "d", columns: ["id", "owner_id", "body"], identity: ["id"])
        let problem = byKey.problem(table: "public.notes", routed: ["owner_id"])
        #expect(problem?.contains("public.notes") == true && problem?.contains("owner_id") == true)
        #expect(problem?.contains("ALTER TABLE public.notes REPLICA IDENTITY FULL") == true)
        #expect(problem?.contains("the primary key (id)") == true)
        #expect(byKey.problem(table: "public.notes", routed: ["id"]) == nil)
        #expect(
            Identity(kind: "f", columns: ["id", "owner_id"], identity: ["id", "owner_id"])
                .problem(table: "public.notes", routed: ["owner_id"]) == nil)
        #expect(
            Identity(kind: "n", columns: ["id", "owner_id"], identity: [])
                .problem(table: "public.notes", routed: ["owner_id"])?.contains("NOTHING") == true)
        #expect(
            Identity(kind: "i", columns: ["id", "owner_id"], identity: ["owner_id"])
                .problem(table: "public.notes", routed: ["owner_id"]) == nil)
        #expect(byKey.problem(table: "public.notes", routed: ["ownr"])?.contains("has no column ownr") == true)
        #expect(
            byKey.problem(table: "public.Odd Table", routed: ["owner_id"])?
                .contains(#"ALTER TABLE public."Odd Table" REPLICA IDENTITY FULL"#) == true)
        #expect(Identity.sqlName("app.notes_2") == "app.notes_2")
        #expect(Identity.sqlName(#"public.Notes"#) == #"public."Notes""#)
    }

    @Test func dsn() throws {
        let tcp = try PostgresDSN("postgres://relay:p%40ss@127.0.0.1:55432/app")
        #expect(tcp.user == "relay" && tcp.password == "p@ss" && tcp.host == "127.0.0.1" && tcp.port == 55432)
        #expect(tcp.database == "app" && tcp.socketDirectory == nil)
        let socket = try PostgresDSN("postgresql://postgres@/postgres?host=/tmp/pg&port=5433")
        #expect(
            socket.socketDirectory == "/tmp/pg" && socket.port == 5433 && socket.endpoint == "/tmp/pg/.s.PGSQL.5433")
        let defaults = try PostgresDSN("postgres://")
        #expect(defaults.user == "postgres" && defaults.database == "postgres" && defaults.port == 5432)
        expectRelayError(.invalidURL) { try PostgresDSN("mysql://x") }
        let badPort = expectRelayError(.invalidURL) { try PostgresDSN("postgres://h:99999/db") }
        #expect(badPort?.message == "invalid --dsn postgres://h:99999/db: bad port 99999")
        let v6 = try PostgresDSN("postgres://u@[::1]:5433/d%C3%A9j%C3%A0")
        #expect(v6.host == "::1" && v6.port == 5433 && v6.user == "u" && v6.password == nil && v6.database == "déjà")
        let badEscape = expectRelayError(.invalidURL) { try PostgresDSN("postgres://u%zz@h/db") }
        #expect(badEscape?.message == "invalid --dsn: bad percent-escape in u%zz")
        let notUTF8 = expectRelayError(.invalidURL) { try PostgresDSN("postgres://u:%FF@h/db") }
        #expect(notUTF8?.message == "invalid --dsn: %FF is not UTF-8")
        #expect(defaults.sslMode == .prefer && defaults.sslRootCertificate == nil)
        #expect(try PostgresDSN("postgres://h/db?sslmode=verify-full").sslMode == .verifyFull)
        expectRelayError(.invalidURL) { try PostgresDSN("postgres://h/db?sslmode=sometimes") }
        expectRelayError(.invalidURL) { try PostgresDSN("postgres://h/db?sslrootcert=/nonexistent/ca.pem") }
    }
}
