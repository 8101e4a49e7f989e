import Bayeux
import Testing

@testable import PubSubRelay

/// Positions and batches of the pgoutput stream, driven with messages made here.
@Suite struct PgOutputAssemblerTests {
    static let notes = PgOutputRelation(
        oid: 42, namespace: "public", name: "notes", replicaIdentity: UInt8(ascii: "d"),
        columns: [.init(name: "id", typeOID: 25, isKey: true), .init(name: "body", typeOID: 25, isKey: false)])

    /// A transaction of `count` inserts whose commit record starts at `start` and ends at `end`.
    static func transaction(start: UInt64, end: UInt64, count: Int, xid: UInt32 = 9) -> [PgOutputMessage] {
        [.begin(finalLSN: LSN(start), commitTime: 0, xid: xid)]
            + (1...count).map { .insert(relation: 42, new: [.text("n\($0)"), .text("body")]) }
            + [.commit(commitLSN: LSN(start), endLSN: LSN(end), commitTime: 0)]
    }

    static func run(
        _ messages: [PgOutputMessage], after: PostgresPosition = .init(lsn: LSN(0)), limit: Int
    ) throws -> [ChangeBatch] {
        var assembler = PgOutputAssembler(after: after, limit: limit)
        try assembler.feed(.relation(notes), at: LSN(1))
        var batches: [ChangeBatch] = []
        for message in messages {
            try assembler.feed(message, at: LSN(1))
            while let batch = assembler.batch(flush: false) { batches.append(batch) }
        }
        if let batch = assembler.batch(flush: true) { batches.append(batch) }
        return batches
    }

    @Test func smallTransactionsGoOutAtTheirCommitEndInOneBatch() throws {
        let batches = try Self.run(
            Self.transaction(start: 0x100, end: 0x130, count: 2) + Self.transaction(start: 0x130, end: 0x160, count: 1),
            limit: 10)
        #expect(batches.count == 1)
        #expect(batches[0].changes.map(\.seq) == ["0/130:1", "0/130:2", "0/160:1"])
        #expect(batches[0].position == "0/160")
        #expect(batches[0].changes.map(\.id) == ["n1", "n2", "n1"])
    }

    @Test func aFullBatchEndsInsideTheTransactionsBeforeIt() throws {
        let batches = try Self.run(
            Self.transaction(start: 0x100, end: 0x130, count: 2) + Self.transaction(start: 0x130, end: 0x160, count: 2),
            limit: 3)
        #expect(batches.map(\.changes.count) == [3, 1])
        #expect(batches.map(\.position) == ["0/160:1", "0/160"])
    }

    @Test func aTransactionLargerThanABatchIsPositionedByItsStartAndHandedOutBeforeItsCommit() throws {
        let messages = Self.transaction(start: 0x100, end: 0x130, count: 5)
        var assembler = PgOutputAssembler(after: PostgresPosition(lsn: LSN(0)), limit: 2)
        try assembler.feed(.relation(Self.notes), at: LSN(1))
        var batches: [ChangeBatch] = []
        for message in messages.dropLast() {
            try assembler.feed(message, at: LSN(1))
            while let batch = assembler.batch(flush: false) { batches.append(batch) }
        }
        // Before the commit: the first four changes are out, and at most a batch more is held.
        #expect(batches.map(\.position) == ["0/101:2", "0/101:4"])
        #expect(assembler.heldChanges <= 2)
        try assembler.feed(messages.last!, at: LSN(1))
        batches.append(assembler.batch(flush: true)!)
        #expect(batches.flatMap(\.changes).map(\.seq) == ["0/101:1", "0/101:2", "0/101:3", "0/101:4", "0/101:5"])
        #expect(batches.last?.position == "0/130")
        // Both forms sort between the transaction before and the one after.
        #expect(PostgresPosition("0/100")! < PostgresPosition("0/101:1")!)
        #expect(PostgresPosition("0/101:5")! < PostgresPosition("0/130")!)
    }

    @Test func aReplayResumesAfterTheCheckpointInsideALargeTransaction() throws {
        let messages = Self.transaction(start: 0x100, end: 0x130, count: 5)
        let batches = try Self.run(messages, after: PostgresPosition("0/101:2")!, limit: 2)
        #expect(batches.flatMap(\.changes).map(\.seq) == ["0/101:3", "0/101:4", "0/101:5"])
        #expect(batches.last?.position == "0/130")
    }

    @Test func aReplayResumesAfterTheCheckpointInsideASmallTransaction() throws {
        let messages = Self.transaction(start: 0x100, end: 0x130, count: 3)
        let batches = try Self.run(messages, after: PostgresPosition("0/130:2")!, limit: 5)
        #expect(batches.flatMap(\.changes).map(\.seq) == ["0/130:3"])
    }

    @Test func aReplayOfWhatWasRelayedGivesOnlyThePositionOrNothing() throws {
        let messages = Self.transaction(start: 0x100, end: 0x130, count: 3)
        #expect(try Self.run(messages, after: PostgresPosition("0/130")!, limit: 5).isEmpty)
    }

    @Test func aKeepaliveMovesThePositionOnlyBetweenTransactions() throws {
        var assembler = PgOutputAssembler(after: PostgresPosition(lsn: LSN(0x100)), limit: 5)
        try assembler.feed(.relation(Self.notes), at: LSN(1))
        let moved = assembler.progress(to: LSN(0x200))
        #expect(moved)
        let batch = assembler.batch(flush: true)
        #expect(batch == ChangeBatch(changes: [], position: "0/200"))
        let back = assembler.progress(to: LSN(0x180))
        #expect(!back)
        try assembler.feed(.begin(finalLSN: LSN(0x300), commitTime: 0, xid: 1), at: LSN(1))
        let inside = assembler.progress(to: LSN(0x280))
        #expect(!inside)
        let none = assembler.batch(flush: true)
        #expect(none == nil)
    }

    @Test func anUnchangedToastValueIsLeftOutAndAnUnknownRelationRefused() throws {
        var assembler = PgOutputAssembler(after: PostgresPosition(lsn: LSN(0)), limit: 5)
        try assembler.feed(.relation(Self.notes), at: LSN(1))
        try assembler.feed(.begin(finalLSN: LSN(0x100), commitTime: 0, xid: 1), at: LSN(1))
        try assembler.feed(.update(relation: 42, old: nil, new: [.text("n1"), .unchangedToast]), at: LSN(1))
        try assembler.feed(.commit(commitLSN: LSN(0x100), endLSN: LSN(0x130), commitTime: 0), at: LSN(1))
        let batch = assembler.batch(flush: true)
        #expect(batch?.changes.first?.document == ["id": .string("n1")])
        #expect(throws: RelayError.self) { try assembler.feed(.insert(relation: 7, new: []), at: LSN(1)) }
    }

    @Test func valuesAreWrittenAsWal2JSONWritesThem() {
        #expect(PgOutputValue.text("12.50").json(type: 1700) == .number("12.50"))
        #expect(PgOutputValue.text("-3").json(type: 20) == .number("-3"))
        #expect(PgOutputValue.text("NaN").json(type: 701) == .null)
        #expect(PgOutputValue.text("-Infinity").json(type: 700) == .null)
        #expect(PgOutputValue.text("t").json(type: 16) == .bool(true))
        #expect(PgOutputValue.text("\\x0102").json(type: 17) == .string("0102"))
        #expect(PgOutputValue.text(#"{"a": 1}"#).json(type: 3802) == .string(#"{"a": 1}"#))
        #expect(PgOutputValue.null.json(type: 23) == .null)
        #expect(PgOutputValue.unchangedToast.json(type: 25) == nil)
    }
}
