import Bayeux
import Logging
import NIOConcurrencyHelpers
import Testing

@testable import PubSubRelay

#if canImport(Glibc)
    import Glibc
#endif

/// The pipeline's rule without tasks: one write at a time, each covering what was acknowledged before it began.
@Suite struct CheckpointPipelineTests {
    @Test func aWriteCoversEveryBatchAcknowledgedSinceTheLastOneBegan() {
        var pipeline = CheckpointPipeline(capacity: 3)
        #expect(pipeline.startWrite() == nil)
        pipeline.acknowledged("0/1")
        #expect(pipeline.startWrite() == .init(position: "0/1", confirms: ["0/1"]))
        // While it is written, the relay publishes on.
        pipeline.acknowledged("0/2")
        pipeline.acknowledged("0/3")
        #expect(pipeline.hasRoom)
        #expect(pipeline.startWrite() == nil)
        pipeline.acknowledged("0/4")
        #expect(!pipeline.hasRoom)
        pipeline.written()
        #expect(pipeline.startWrite() == .init(position: "0/4", confirms: ["0/2", "0/3", "0/4"]))
        #expect(pipeline.hasRoom)
        #expect(!pipeline.isIdle)
        pipeline.written()
        #expect(pipeline.isIdle)
        #expect(pipeline.startWrite() == nil)
    }
}

/// A checkpoint store whose saves wait until the test lets them go (they run on NIO's thread pool, so blocking is
/// what a slow disk does).
final class SlowStore: CheckpointStore {
    let inner: FileCheckpointStore
    let journal: Journal
    private let gate = ConditionLock(value: 0)
    let saves = NIOLockedValueBox(0)
    let failing = NIOLockedValueBox(false)

    init(path: String, journal: Journal) {
        inner = FileCheckpointStore(path: path)
        self.journal = journal
    }

    func open() {
        gate.lock()
        gate.unlock(withValue: 1)
    }

    func load() throws -> Checkpoint? { try inner.load() }
    func save(_ checkpoint: Checkpoint) throws {
        saves.withLockedValue { $0 += 1 }
        gate.lock(whenValue: 1)
        gate.unlock()
        if failing.withLockedValue({ $0 }) {
            journal.record("persist failed")
            throw Injected()
        }
        try inner.save(checkpoint)
        journal.record("persist \(checkpoint.position)")
    }
}

/// A broker that acknowledges at once and journals.
final class CountingPublisher: Publisher {
    let journal: Journal
    init(journal: Journal) { self.journal = journal }
    func publish(_ messages: [RelayMessage]) async throws {
        journal.record("publish \(messages.map { $0.data.objectValue!["id"]!.stringValue! }.joined(separator: ","))")
    }
}

@Suite(.timeLimit(.minutes(1))) struct CheckpointBehindThePublishesTests {
    static func batch(_ index: Int) -> ChangeBatch {
        ChangeBatch(changes: [change("d\(index)", "0/\(index):1")], position: "0/\(index)")
    }

    /// A relay over a pushing source and a `SlowStore` in `directory`, running, its source connected.
    struct Running {
        let journal = Journal()
        let source: PushingSource
        let store: SlowStore
        let task: Task<Void, any Error>

        init(directory: String, capacity: Int, backlog: Int = 1024, failing: Bool = false) async throws {
            source = PushingSource(journal: journal, capacity: capacity)
            store = SlowStore(path: directory + "/checkpoint", journal: journal)
            if failing {
                store.failing.withLockedValue { $0 = true }
                store.open()
            }
            let relay = Relay(
                source: source, publisher: CountingPublisher(journal: journal), store: store,
                configuration: .init(checkpointBacklog: backlog), logger: Logger(label: "test"))
            task = Task { try await relay.run() }
            try await PushingSourceTests.waitFor { source.feed.connections == 1 }
        }
    }

    @Test func batchesArePublishedWhileTheCheckpointIsWrittenAndConfirmedOnlyOnceItIsDurable() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let running = try await Running(directory: directory, capacity: 8)
        let (journal, source, store, task) = (running.journal, running.source, running.store, running.task)
        defer { task.cancel() }
        for index in 1...4 { try await source.feed.hand(Self.batch(index)) }
        // The first checkpoint is stuck on the disk; every batch is published anyway, and none is confirmed.
        try await PushingSourceTests.waitFor { journal.events.contains("publish d4") }
        try await PushingSourceTests.waitFor { store.saves.withLockedValue { $0 } == 1 }
        #expect(!journal.events.contains { $0.hasPrefix("confirm") })
        store.open()
        try await PushingSourceTests.waitFor { journal.events.contains("confirm 0/4") }
        // Confirms in order, each after a durable checkpoint at or past it; the three behind the first share one.
        let confirms = journal.events.filter { $0.hasPrefix("confirm") }
        #expect(confirms == ["confirm 0/1", "confirm 0/2", "confirm 0/3", "confirm 0/4"])
        let persists = journal.events.filter { $0.hasPrefix("persist") }
        #expect(persists == ["persist 0/1", "persist 0/4"])
        for (index, event) in journal.events.enumerated() where event.hasPrefix("confirm") {
            let position = Int(event.split(separator: "/").last!)!
            let durable = journal.events[..<index].compactMap { event -> Int? in
                event.hasPrefix("persist") ? Int(event.split(separator: "/").last!) : nil
            }
            #expect(durable.contains { $0 >= position })
        }
        #expect(try store.load()?.position == "0/4")
        task.cancel()
        _ = await task.result
        await source.close()
    }

    @Test func aStoppedRelayStillLeavesTheCheckpointItBegan() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let running = try await Running(directory: directory, capacity: 8)
        let (journal, source, store, task) = (running.journal, running.source, running.store, running.task)
        for index in 1...3 { try await source.feed.hand(Self.batch(index)) }
        try await PushingSourceTests.waitFor { journal.events.contains("publish d3") }
        task.cancel()
        store.open()
        _ = await task.result
        // What was acknowledged before the stop is checkpointed and confirmed when `run` returns.
        #expect(try store.load()?.position == "0/3")
        #expect(journal.events.filter { $0.hasPrefix("confirm") }.last == "confirm 0/3")
        await source.close()
    }

    @Test func aFailedCheckpointStopsTheRelayAtOnceAndConfirmsNothing() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let running = try await Running(directory: directory, capacity: 8, failing: true)
        let (journal, source, store, task) = (running.journal, running.source, running.store, running.task)
        try await source.feed.hand(Self.batch(1))
        // The feed is quiet after it: the relay ends with the store's error all the same.
        await #expect(throws: Injected.self) { try await task.value }
        #expect(journal.events == ["publish d1", "persist failed"])
        #expect(try store.load() == nil)
        await source.close()
    }

    @Test func theRelayWaitsForTheWriteOnceTheBacklogIsFull() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let running = try await Running(directory: directory, capacity: 16, backlog: 2)
        let (journal, source, store, task) = (running.journal, running.source, running.store, running.task)
        defer { task.cancel() }
        for index in 1...6 { try await source.feed.hand(Self.batch(index)) }
        // One batch in the write under way, two waiting for the next: the fourth waits for the disk.
        try await PushingSourceTests.waitFor { journal.events.contains("publish d3") }
        try await PushingSourceTests.waitFor { source.feed.stream.bufferedChanges == 3 }
        #expect(!journal.events.contains("publish d4"))
        store.open()
        try await PushingSourceTests.waitFor { journal.events.contains("confirm 0/6") }
        #expect(journal.events.filter { $0.hasPrefix("confirm") } == (1...6).map { "confirm 0/\($0)" })
        task.cancel()
        _ = await task.result
        await source.close()
    }
}
