import Bayeux
import Logging
import NIOConcurrencyHelpers
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@testable import PubSubRelay

/// A document source gives no old values: deletes (tombstones) and moves are routed by what the relay remembers,
/// which survives a restart and is bounded.
@Suite(.serialized) struct AudienceMemoryTests {
    static let route = try! Route(parsing: "notes=/users/{doc.owner}/notes")

    static func doc(_ id: String, _ op: Change.Operation, owner: String?, seq: String) -> Change {
        var document: JSONObject = ["_id": .string(id)]
        if op == .delete { document["_deleted"] = true } else { document["owner"] = owner.map(JSONValue.string) ?? .null }
        return Change(collection: ["notes"], id: id, operation: op, seq: seq, document: document)
    }

    func run(_ batches: [ChangeBatch], directory: String, limit: Int = 100) async throws -> [String] {
        let journal = Journal()
        let source = FakeSource(journal: journal, batches: batches)
        let publisher = FakePublisher(journal: journal)
        let relay = Relay(
            source: source, publisher: publisher, store: FileCheckpointStore(path: directory + "/checkpoint"),
            configuration: .init(mapping: ChangeMapping(routes: [Self.route]), audiencePath: directory + "/checkpoint.audience",
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
        let first = try await run([
            ChangeBatch(changes: [Self.doc("n1", .insert, owner: "a", seq: "1"), Self.doc("n2", .insert, owner: "b", seq: "2")],
                        position: "2"),
        ], directory: directory)
        #expect(first == ["insert n1 /users/a/notes", "insert n2 /users/b/notes"])
        // A new process: what it remembers comes from the file.
        let second = try await run([
            ChangeBatch(changes: [Self.doc("n1", .update, owner: "b", seq: "3")], position: "3"),
            ChangeBatch(changes: [Self.doc("n2", .delete, owner: nil, seq: "4")], position: "4"),
            ChangeBatch(changes: [Self.doc("n1", .delete, owner: nil, seq: "5")], position: "5"),
        ], directory: directory)
        #expect(second == [
            "update n1 /users/a/notes left", "update n1 /users/b/notes joined",
            "delete n2 /users/b/notes", "delete n1 /users/b/notes",
        ])
    }

    /// Past its bound the least recently changed document is forgotten: its delete cannot be routed, and that is
    /// counted (`no_previous`), never sent to a wrong audience.
    @Test func theMemoryIsBoundedAndAForgottenDocumentsDeleteGoesNowhere() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let published = try await run([
            ChangeBatch(changes: (0..<5).map { Self.doc("n\($0)", .insert, owner: "u\($0)", seq: "\($0)") }, position: "5"),
            ChangeBatch(changes: [Self.doc("n0", .delete, owner: nil, seq: "6"), Self.doc("n4", .delete, owner: nil, seq: "7")],
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
