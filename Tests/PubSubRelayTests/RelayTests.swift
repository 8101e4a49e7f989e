import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Testing

@testable import PubSubRelay

#if canImport(Glibc)
    import Glibc
#endif

/// What happened, in order, across the fake source, the fake broker and the checkpoint store.
final class Journal: Sendable {
    private let box = NIOLockedValueBox<[String]>([])
    func record(_ event: String) { box.withLockedValue { $0.append(event) } }
    var events: [String] { box.withLockedValue { $0 } }
}

struct Injected: Error {}

/// A source holding batches; confirm records the position.
actor FakeSource: ChangeSource {
    nonisolated let sourceID = "fake:1"
    let journal: Journal
    var batches: [ChangeBatch]
    var startedAfter: String??

    init(journal: Journal, batches: [ChangeBatch]) {
        self.journal = journal
        self.batches = batches
    }

    func start(after position: String?) async throws { startedAfter = .some(position) }
    func next() async throws -> ChangeBatch? { batches.first }
    func confirm(_ position: String) async throws {
        journal.record("confirm \(position)")
        batches.removeAll { $0.position == position }
    }
    func lag() async -> SourceLag? { nil }
    func close() async {}
}

/// A broker that acknowledges, or fails the first `failures` publishes.
final class FakePublisher: Publisher {
    let journal: Journal
    let failures = NIOLockedValueBox(0)
    let published = NIOLockedValueBox<[RelayMessage]>([])
    init(journal: Journal, failures: Int = 0) {
        self.journal = journal
        self.failures.withLockedValue { $0 = failures }
    }
    func publish(_ messages: [RelayMessage]) async throws {
        let fail = failures.withLockedValue { count -> Bool in
            defer { count = max(0, count - 1) }
            return count > 0
        }
        if fail {
            journal.record("publish failed")
            throw RelayError(.publish, "broker unavailable")
        }
        published.withLockedValue { $0 += messages }
        journal.record("publish \(messages.map { $0.data.objectValue!["id"]!.stringValue! }.joined(separator: ","))")
    }
}

/// A checkpoint store that journals, wrapping the real file store.
struct JournalingStore: CheckpointStore {
    let inner: FileCheckpointStore
    let journal: Journal
    func load() throws -> Checkpoint? { try inner.load() }
    func save(_ checkpoint: Checkpoint) throws {
        do {
            try inner.save(checkpoint)
            journal.record("persist \(checkpoint.position)")
        } catch {
            journal.record("persist failed")
            throw error
        }
    }
}

func temporaryDirectory() -> String {
    var template = Array("/tmp/pubsub-relay-test-XXXXXX".utf8CString)
    let path = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    return String(cString: path!)
}

func removeDirectory(_ path: String) {
    // The checkpoint and the audience memory beside it (`<checkpoint>.audience`), with their temporary files.
    for name in ["checkpoint", "checkpoint.tmp", "checkpoint.audience", "checkpoint.audience.tmp"] {
        unlink(path + "/" + name)
    }
    rmdir(path)
}

func change(_ id: String, _ seq: String) -> Change {
    Change(collection: ["public", "notes"], id: id, operation: .insert, seq: seq)
}

@Suite(.serialized) struct CheckpointAndOrderTests {
    @Test func checkpointRoundTripsAndSurvivesAFailureAtEveryStep() throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let path = directory + "/checkpoint"
        #expect(try FileCheckpointStore(path: path).load() == nil)
        try FileCheckpointStore(path: path).save(Checkpoint(sourceID: "pg:s", position: "0/10"))
        #expect(try FileCheckpointStore(path: path).load() == Checkpoint(sourceID: "pg:s", position: "0/10"))

        for step in FileCheckpointStore.Step.allCases {
            let failing = FileCheckpointStore(path: path) { current in if current == step { throw Injected() } }
            #expect(throws: Injected.self) { try failing.save(Checkpoint(sourceID: "pg:s", position: "0/20")) }
            let loaded = try FileCheckpointStore(path: path).load()
            // Until the rename the old checkpoint stands; from the rename on the new one does.
            let expected = step == .syncDirectory ? "0/20" : "0/10"
            #expect(loaded?.position == expected, "failure before \(step)")
            try FileCheckpointStore(path: path).save(Checkpoint(sourceID: "pg:s", position: "0/10"))
        }
        // A corrupt file is an error, not a silent restart from scratch.
        let fd = open(path, O_WRONLY | O_TRUNC)
        _ = write(fd, "garbage", 7)
        close(fd)
        expectRelayError(.checkpoint) { try FileCheckpointStore(path: path).load() }
    }

    @Test func publishThenAckThenPersistThenConfirm() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let journal = Journal()
        let source = FakeSource(
            journal: journal,
            batches: [
                ChangeBatch(changes: [change("a", "0/10:1"), change("b", "0/10:2")], position: "0/10"),
                ChangeBatch(changes: [], position: "0/20"),
                ChangeBatch(changes: [change("a", "0/30:1")], position: "0/30"),
            ])
        let publisher = FakePublisher(journal: journal)
        let store = JournalingStore(inner: FileCheckpointStore(path: directory + "/checkpoint"), journal: journal)
        let relay = Relay(source: source, publisher: publisher, store: store, logger: Logger(label: "test"))
        try await relay.start()
        while try await relay.step() != nil {}
        #expect(
            journal.events == [
                "publish a,b", "persist 0/10", "confirm 0/10",
                "persist 0/20", "confirm 0/20",
                "publish a", "persist 0/30", "confirm 0/30",
            ])
        #expect(try store.load()?.position == "0/30")
    }

    @Test func aFailedPublishIsRetriedWithTheSameKeysBeforeAnythingIsPersisted() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let journal = Journal()
        let source = FakeSource(
            journal: journal,
            batches: [
                ChangeBatch(changes: [change("a", "0/10:1")], position: "0/10")
            ])
        let publisher = FakePublisher(journal: journal, failures: 2)
        let store = JournalingStore(inner: FileCheckpointStore(path: directory + "/checkpoint"), journal: journal)
        let relay = Relay(
            source: source, publisher: publisher, store: store,
            configuration: .init(retryDelay: .milliseconds(1)), logger: Logger(label: "test"))
        try await relay.start()
        try await relay.step()
        #expect(journal.events == ["publish failed", "publish failed", "publish a", "persist 0/10", "confirm 0/10"])
    }

    @Test func aFailedPersistNeverConfirmsAndARestartRepublishesWithTheSameKeys() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let path = directory + "/checkpoint"
        let journal = Journal()
        let batches = [
            ChangeBatch(changes: [change("a", "0/10:1")], position: "0/10"),
            ChangeBatch(changes: [change("b", "0/20:1")], position: "0/20"),
        ]
        let source = FakeSource(journal: journal, batches: batches)
        let publisher = FakePublisher(journal: journal)
        let failRename = NIOLockedValueBox(false)
        let store = JournalingStore(
            inner: FileCheckpointStore(path: path) { step in
                if step == .rename, failRename.withLockedValue({ $0 }) { throw Injected() }
            }, journal: journal)
        let relay = Relay(source: source, publisher: publisher, store: store, logger: Logger(label: "test"))
        try await relay.start()
        try await relay.step()
        failRename.withLockedValue { $0 = true }
        await #expect(throws: Injected.self) { try await relay.step() }
        #expect(journal.events == ["publish a", "persist 0/10", "confirm 0/10", "publish b", "persist failed"])

        // The process dies here; a new one loads the checkpoint and gets "b" again from the source.
        #expect(try FileCheckpointStore(path: path).load()?.position == "0/10")
        let restarted = Relay(
            source: source, publisher: publisher, store: FileCheckpointStore(path: path), logger: Logger(label: "test"))
        try await restarted.start()
        #expect(await source.startedAfter == .some("0/10"))
        try await restarted.step()
        let keys = publisher.published.withLockedValue { $0 }.filter { $0.data.objectValue?["id"] == "b" }.map(\.key)
        #expect(keys.count == 2 && keys[0] == keys[1])
        #expect(try FileCheckpointStore(path: path).load()?.position == "0/20")
    }

    @Test func aCheckpointOfAnotherSourceIsRefused() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        try FileCheckpointStore(path: directory + "/checkpoint").save(Checkpoint(sourceID: "pg:other", position: "0/1"))
        let journal = Journal()
        let relay = Relay(
            source: FakeSource(journal: journal, batches: []), publisher: FakePublisher(journal: journal),
            store: FileCheckpointStore(path: directory + "/checkpoint"), logger: Logger(label: "test"))
        await expectRelayError(.checkpoint) { try await relay.start() }
    }
}

/// A source that pushes through `PushFeed`: the test hands batches over as a server would send them.
final class PushingSource: ChangeSource {
    let sourceID = "fake:push"
    let feed: PushFeed
    let journal: Journal

    init(journal: Journal, capacity: Int) {
        self.journal = journal
        feed = PushFeed(capacity: capacity)
    }

    func start(after position: String?) async throws {
        feed.start(
            after: position, backoff: Backoff(initial: .milliseconds(1), maximum: .milliseconds(1)),
            connect: { _ in try await Task.sleep(for: .seconds(3600)) }, ended: { _, _ in .pause(reset: false) })
    }
    func next() async throws -> ChangeBatch? { try await feed.next() }
    func confirm(_ position: String) async throws { journal.record("confirm \(position)") }
    func lag() async -> SourceLag? { nil }
    func close() async { await feed.close() }
}

/// A broker that holds every publish until it is let go.
final class GatedPublisher: Publisher {
    let open = NIOLockedValueBox(false)
    let published = NIOLockedValueBox(0)
    func publish(_ messages: [RelayMessage]) async throws {
        while !open.withLockedValue({ $0 }) { try await Task.sleep(for: .milliseconds(2)) }
        published.withLockedValue { $0 += messages.count }
    }
}

@Suite(.timeLimit(.minutes(1))) struct PushingSourceTests {
    static func waitFor(_ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(20)
        while !condition() {
            guard ContinuousClock.now < deadline else { throw Injected() }
            try await Task.sleep(for: .milliseconds(2))
        }
    }

    @Test func aPushedBatchIsRelayedAtOnceAndTheReaderWaitsWhileTheBrokerIsBehind() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let journal = Journal()
        let source = PushingSource(journal: journal, capacity: 2)
        let publisher = GatedPublisher()
        let relay = Relay(
            source: source, publisher: publisher,
            store: FileCheckpointStore(path: directory + "/checkpoint"), logger: Logger(label: "test"))
        let task = Task { try await relay.run() }
        defer { task.cancel() }
        try await Self.waitFor { source.feed.connections == 1 }
        let handed = NIOLockedValueBox(0)
        let reader = Task {
            for index in 1...6 {
                try await source.feed.hand(
                    ChangeBatch(
                        changes: [change("d\(index)", "0/\(index):1")],
                        position: "0/\(index)"))
                handed.withLockedValue { $0 = index }
            }
        }
        // The broker holds the first batch the relay took: the stream fills up (two batches) and the reader waits.
        try await Self.waitFor { handed.withLockedValue { $0 } >= 1 }
        try await Task.sleep(for: .milliseconds(100))
        let stopped = handed.withLockedValue { $0 }
        #expect(stopped <= 2)
        try await Task.sleep(for: .milliseconds(100))
        #expect(handed.withLockedValue { $0 } == stopped)
        #expect(source.feed.stream.bufferedChanges <= 2)
        publisher.open.withLockedValue { $0 = true }
        try await reader.value
        try await Self.waitFor { journal.events.contains("confirm 0/6") }
        #expect(journal.events == (1...6).map { "confirm 0/\($0)" })
        #expect(publisher.published.withLockedValue { $0 } == 6)
        task.cancel()
        _ = await task.result
        await source.close()
    }
}
