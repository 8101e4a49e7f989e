import Bayeux
import Logging
import NIOConcurrencyHelpers
import Testing

@testable import PubSubRelay

#if canImport(Glibc)
    import Glibc
#endif

/// A document source gives no old values: deletes (tombstones) and moves are routed by what the relay remembers,
/// which survives a restart and is bounded.
@Suite(.serialized) struct AudienceMemoryTests {
    static let route = try! Route(parsing: "notes=/users/{doc.owner}/notes")

    static func doc(_ id: String, _ op: Change.Operation, owner: String?, seq: String) -> Change {
        var document: JSONObject = ["_id": .string(id)]
        if op == .delete {
            document["_deleted"] = true
        } else {
            document["owner"] = owner.map(JSONValue.string) ?? .null
        }
        return Change(collection: ["notes"], id: id, operation: op, seq: seq, document: document)
    }

    func run(_ batches: [ChangeBatch], directory: String, limit: Int = 100) async throws -> [String] {
        let journal = Journal()
        let source = FakeSource(journal: journal, batches: batches)
        let publisher = FakePublisher(journal: journal)
        let relay = Relay(
            source: source, publisher: publisher, store: FileCheckpointStore(path: directory + "/checkpoint"),
            configuration: .init(
                mapping: ChangeMapping(routes: [Self.route]), audiencePath: directory + "/checkpoint.audience",
                rememberedDocuments: limit),
            logger: Logger(label: "test"))
        try await relay.start()
        while try await relay.step() != nil {}
        return publisher.published.withLockedValue { messages in
            messages.map { message in
                let data = message.data.objectValue!
                return "\(data["op"]!.stringValue!) \(data["id"]!.stringValue!) \(message.channel)"
                    + (data["audience"]?.stringValue.map { " " + $0 } ?? "")
            }
        }
    }

    @Test func aTombstoneAndAMoveAreRoutedByTheRememberedValuesAcrossARestart() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let first = try await run(
            [
                ChangeBatch(
                    changes: [
                        Self.doc("n1", .insert, owner: "a", seq: "1"), Self.doc("n2", .insert, owner: "b", seq: "2"),
                    ],
                    position: "2")
            ], directory: directory)
        #expect(first == ["insert n1 /users/a/notes", "insert n2 /users/b/notes"])
        // A new process: what it remembers comes from the file.
        let second = try await run(
            [
                ChangeBatch(changes: [Self.doc("n1", .update, owner: "b", seq: "3")], position: "3"),
                ChangeBatch(changes: [Self.doc("n2", .delete, owner: nil, seq: "4")], position: "4"),
                ChangeBatch(changes: [Self.doc("n1", .delete, owner: nil, seq: "5")], position: "5"),
            ], directory: directory)
        #expect(
            second == [
                "update n1 /users/a/notes left", "update n1 /users/b/notes joined",
                "delete n2 /users/b/notes", "delete n1 /users/b/notes",
            ])
    }

    /// Past its bound the least recently changed document is forgotten: its delete cannot be routed, and that is
    /// counted (`no_previous`), never sent to a wrong audience.
    @Test func theMemoryIsBoundedAndAForgottenDocumentsDeleteGoesNowhere() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let published = try await run(
            [
                ChangeBatch(
                    changes: (0..<5).map { Self.doc("n\($0)", .insert, owner: "u\($0)", seq: "\($0)") }, position: "5"),
                ChangeBatch(
                    changes: [
                        Self.doc("n0", .delete, owner: nil, seq: "6"), Self.doc("n4", .delete, owner: nil, seq: "7"),
                    ],
                    position: "7"),
            ], directory: directory, limit: 3)
        #expect(published.suffix(1) == ["delete n4 /users/u4/notes"])
        #expect(!published.contains { $0.hasPrefix("delete n0") })
        let memory = AudienceMemory(limit: 3, path: directory + "/checkpoint.audience")
        try memory.load()
        #expect(memory.count == 2, "n2 and n3 remain: n0 and n1 were forgotten, n4 deleted")
    }
    /// A memory file that is not one (truncated, edited by hand) stops the relay at start with a checkpoint error
    /// naming the file, rather than routing deletes by nothing.
    @Test func aDamagedMemoryFileIsRefusedAtStart() async throws {
        let directory = temporaryDirectory()
        let path = directory + "/checkpoint.audience"
        defer {
            unlink(path)
            removeDirectory(directory)
        }
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        _ = "{\"entries\": [[\"notes".withCString { write(fd, $0, strlen($0)) }
        close(fd)
        let relay = Relay(
            source: FakeSource(journal: Journal(), batches: []), publisher: FakePublisher(journal: Journal()),
            store: FileCheckpointStore(path: directory + "/checkpoint"),
            configuration: .init(mapping: ChangeMapping(routes: [Self.route]), audiencePath: path),
            logger: Logger(label: "test"))
        do {
            try await relay.start()
            Issue.record("a damaged memory file was accepted")
        } catch let error as RelayError {
            #expect(error.code == .checkpoint && error.message.contains(path))
        }
    }
}

/// The memory is a journal: a batch appends what it changed (its cost grows with the batch, not with the memory), a
/// compaction in the background folds the journal into the snapshot, and whatever was saved is read again by a
/// new process, as after a `kill -9` (nothing is written at exit).
@Suite(.serialized) struct AudienceJournalTests {
    static let route = try! Route(parsing: "notes=/users/{doc.owner}/notes")

    static func change(_ id: String, owner: String?) -> Change {
        var document: JSONObject = ["_id": .string(id)]
        let operation: Change.Operation = owner == nil ? .delete : .update
        if let owner { document["owner"] = .string(owner) } else { document["_deleted"] = true }
        return Change(collection: ["notes"], id: id, operation: operation, seq: id, document: document)
    }

    /// The file's size, -1 when it does not exist.
    static func size(_ path: String) -> Int {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return -1 }
        defer { close(fd) }
        return Int(lseek(fd, 0, SEEK_END))
    }

    @Test func aBatchAppendsItsOwnEntriesOnly() throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let path = directory + "/checkpoint.audience"
        let memory = AudienceMemory(limit: 100_000, path: path)
        for i in 0..<5000 { memory.remember(Self.change("n\(i)", owner: "u\(i % 7)"), routes: [Self.route]) }
        try memory.save()
        let journal = try #require(memory.journalPath(0))
        let afterBig = Self.size(journal)
        let snapshot = Self.size(path)
        #expect(afterBig > 5000 * 20)
        // One more change among 5,000 remembered documents: one line appended, the snapshot not rewritten.
        memory.remember(Self.change("n1", owner: "moved"), routes: [Self.route])
        try memory.save()
        #expect(Self.size(journal) - afterBig < 100)
        #expect(Self.size(path) == snapshot)
        // A new process reads the snapshot and replays the journal.
        let again = AudienceMemory(limit: 100_000, path: path)
        try again.load()
        #expect(again.count == 5000)
        #expect(again.previous(of: Self.change("n1", owner: "x")) == ["owner": "moved"])
        #expect(again.previous(of: Self.change("n2", owner: "x")) == ["owner": "u2"])
    }

    @Test func compactionFoldsTheJournalIntoTheSnapshotAndLoadingAgainGivesTheSameMemory() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let path = directory + "/checkpoint.audience"
        let memory = AudienceMemory(limit: 300, path: path)
        // Past the limit (the oldest forgotten), deletes, and enough saves to compact several times.
        for round in 0..<40 {
            for i in 0..<100 {
                memory.remember(Self.change("n\(round * 37 + i)", owner: "r\(round)"), routes: [Self.route])
            }
            memory.remember(Self.change("n\(round * 37)", owner: nil), routes: [Self.route])
            try memory.save()
            // Wait for a running compaction before the next check (a condition, with a deadline).
            let deadline = ContinuousClock.now + .seconds(30)
            while memory.isCompacting, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        }
        let again = AudienceMemory(limit: 300, path: path)
        try again.load()
        #expect(again.count == memory.count)
        for i in 0..<(40 * 37 + 100) {
            let probe = Self.change("n\(i)", owner: "x")
            #expect(again.previous(of: probe) == memory.previous(of: probe), "n\(i)")
        }
        // Compacted: the snapshot holds an epoch past 0, and no journal before it is left.
        let snapshot = try #require(try RelayFile.contents(of: path, limit: 1 << 24))
        let epoch = try #require(try JSONParser().parse(snapshot).objectValue?["epoch"]?.integerValue)
        #expect(epoch > 0)
        for old in 0..<epoch { #expect(Self.size(memory.journalPath(UInt64(old))!) == -1) }
    }

    /// A process killed in the middle of an append leaves a cut line: it belonged to a batch that was never
    /// checkpointed, and is ignored.
    @Test func aCutLastLineIsIgnored() throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let path = directory + "/checkpoint.audience"
        let memory = AudienceMemory(limit: 100, path: path)
        memory.remember(Self.change("n1", owner: "a"), routes: [Self.route])
        try memory.save()
        let fd = open(memory.journalPath(0)!, O_WRONLY | O_APPEND)
        _ = "[\"notes\\u0000n1\",{\"own".withCString { write(fd, $0, strlen($0)) }
        close(fd)
        let again = AudienceMemory(limit: 100, path: path)
        try again.load()
        #expect(again.previous(of: Self.change("n1", owner: "x")) == ["owner": "a"])
    }
}
