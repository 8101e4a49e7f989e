import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import RelayFakes
import Testing

@testable import PubSubRelay

/// Hands out what the CouchDB source hands out, and keeps a copy of every batch.
final class RecordingSource: ChangeSource {
    let inner: CouchDBChangeSource
    let batches = NIOLockedValueBox<[ChangeBatch]>([])
    var sourceID: String { inner.sourceID }

    init(_ inner: CouchDBChangeSource) { self.inner = inner }

    func start(after position: String?) async throws { try await inner.start(after: position) }
    func next() async throws -> ChangeBatch? {
        let batch = try await inner.next()
        if let batch { batches.withLockedValue { $0.append(batch) } }
        return batch
    }
    func confirm(_ position: String) async throws { try await inner.confirm(position) }
    func lag() async -> SourceLag? { await inner.lag() }
    func close() async { await inner.close() }
}

/// A fake `_changes` server, the real relay loop, a file checkpoint and a publisher that acknowledges everything.
final class CouchDBHarness: Sendable {
    let fake: CouchDBFake
    let directory = temporaryDirectory()
    let publisher = FakePublisher(journal: Journal())
    let running = NIOLockedValueBox<[(RecordingSource, Task<Void, any Error>)]>([])

    init(_ flavour: CouchDBFakeStore.Flavour, database: String = "db") async throws {
        fake = try await CouchDBFake.start(store: CouchDBFakeStore(flavour: flavour, database: database))
    }

    var store: CouchDBFakeStore { fake.store }
    var checkpoint: FileCheckpointStore { FileCheckpointStore(path: directory + "/checkpoint") }

    /// Starts a relay (a fresh source resuming from the checkpoint file).
    @discardableResult
    func startRelay(
        feed: CouchDBChangeSource.Feed = .continuous, channels: [String] = [], includeDocs: Bool = false,
        heartbeat: TimeAmount = .milliseconds(200)
    ) throws -> RecordingSource {
        var logger = Logger(label: "test.couchdb")
        logger.logLevel = .critical
        let configuration = CouchDBChangeSource.Configuration(
            url: try CouchDBURL(fake.url), feed: feed, heartbeat: heartbeat, channels: channels,
            includeDocs: includeDocs, maxBatch: 7)
        let source = RecordingSource(CouchDBChangeSource(configuration: configuration, logger: logger))
        let relay = Relay(
            source: source, publisher: publisher, store: checkpoint,
            configuration: .init(mapping: ChangeMapping(includeDocument: includeDocs)), logger: logger)
        let task = Task { try await relay.run() }
        running.withLockedValue { $0.append((source, task)) }
        return source
    }

    /// Stops every relay (cancel, then close its source).
    func stopRelays() async {
        let all = running.withLockedValue { running in
            defer { running = [] }
            return running
        }
        for (source, task) in all {
            task.cancel()
            _ = await task.result
            await source.close()
        }
    }

    func shutdown() async {
        await stopRelays()
        await fake.stop()
        removeDirectory(directory)
    }

    var published: [JSONObject] { publisher.published.withLockedValue { $0.map { $0.data.objectValue! } } }
    var publishedIDs: [String] { published.map { $0["id"]!.stringValue! } }

    /// Waits until `condition` holds (polling), up to `timeout`.
    func eventually(_ what: String, timeout: Duration = .seconds(20), _ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + timeout
        while !condition() {
            if ContinuousClock.now > deadline {
                Issue.record("timed out waiting for \(what); published \(publishedIDs), requests \(store.feedRequests)")
                throw CancellationError()
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Every published message of a document has one key per (seq): duplicates carry the same key.
    func expectStableKeys(sourceLocation: SourceLocation = #_sourceLocation) {
        var keys: [String: Set<String>] = [:]
        for data in published {
            keys[data["id"]!.stringValue! + "|" + data["seq"]!.stringValue!, default: []].insert(
                data["key"]!.stringValue!)
        }
        #expect(keys.values.allSatisfy { $0.count == 1 }, sourceLocation: sourceLocation)
    }
}

/// Runs `body` against a fresh harness and always shuts it down.
func withHarness(
    _ flavour: CouchDBFakeStore.Flavour, database: String = "db",
    _ body: (CouchDBHarness) async throws -> Void
) async throws {
    let harness = try await CouchDBHarness(flavour, database: database)
    do {
        try await body(harness)
    } catch {
        await harness.shutdown()
        throw error
    }
    await harness.shutdown()
}

struct FeedCase: Sendable, CustomTestStringConvertible {
    var flavour: CouchDBFakeStore.Flavour
    var feed: CouchDBChangeSource.Feed
    var testDescription: String { "\(flavour.rawValue)/\(feed.rawValue)" }
}

let allFeedCases: [FeedCase] = [
    FeedCase(flavour: .integer, feed: .continuous), FeedCase(flavour: .integer, feed: .longpoll),
    FeedCase(flavour: .integer, feed: .eventsource), FeedCase(flavour: .opaque, feed: .continuous),
    FeedCase(flavour: .opaque, feed: .longpoll), FeedCase(flavour: .opaque, feed: .eventsource),
    FeedCase(flavour: .syncGateway, feed: .continuous), FeedCase(flavour: .syncGateway, feed: .longpoll),
]

@Suite(.serialized, .timeLimit(.minutes(2))) struct CouchDBSourceTests {
    @Test(arguments: allFeedCases)
    func firstSyncThenLiveChanges(_ feedCase: FeedCase) async throws {
        try await withHarness(feedCase.flavour) { h in
            let revA = try h.store.put("a", ["n": 1])
            try h.store.put("b/c d", ["n": 2])
            try h.store.put("c")
            try h.store.put("a", ["n": 3], rev: revA)
            try h.store.delete("c")
            try h.startRelay(feed: feedCase.feed, includeDocs: true)
            // Only the latest change of each document is in the feed, in seq order.
            try await h.eventually("the first sync") { h.published.count >= 3 }
            #expect(
                h.published.map { [$0["id"]!.stringValue!, $0["op"]!.stringValue!] }
                    == [["b/c d", "insert"], ["a", "update"], ["c", "delete"]])
            let first = h.published[1]
            #expect(first["rev"]?.stringValue?.hasPrefix("2-") == true)
            #expect(first["doc"]?.objectValue?["n"] == 3 && first["collection"] == "db")
            #expect(first["source"]?.stringValue == "couchdb:127.0.0.1:\(h.fake.port)/db")

            // Live changes while the feed is open.
            try h.store.put("d", ["live": true])
            try h.store.put("e")
            try await h.eventually("the live changes") { h.published.count >= 5 }
            #expect(h.publishedIDs == ["b/c d", "a", "c", "d", "e"])
            #expect(Set(h.published.map { $0["key"]!.stringValue! }).count == 5)
            #expect(h.published.allSatisfy { $0["resync"] == nil })
            // The checkpoint is the raw JSON seq of the last change (or a later last_seq), which the server accepts back.
            // (A longpoll feed may checkpoint a later last_seq, but it checkpoints: the wait is for one to be there,
            // which under load comes after the last change is published.)
            try await h.eventually("the checkpoint") {
                guard let saved = try? h.checkpoint.load() else { return false }
                return saved.position == h.published.last!["seq"]!.stringValue! || feedCase.feed == .longpoll
            }
            let position = try #require(try h.checkpoint.load()).position
            #expect(try h.checkpoint.load()?.sourceID == "couchdb:127.0.0.1:\(h.fake.port)/db")
            await h.stopRelays()
            try h.store.put("f")
            try h.startRelay(feed: feedCase.feed)
            try await h.eventually("the change after the restart") { h.publishedIDs.last == "f" }
            #expect(h.store.feedRequests.contains(position))
            #expect(h.publishedIDs == ["b/c d", "a", "c", "d", "e", "f"])
        }
    }

    @Test(arguments: [CouchDBFakeStore.Flavour.integer, .opaque, .syncGateway])
    func heartbeatsKeepTheFeedOpen(_ flavour: CouchDBFakeStore.Flavour) async throws {
        try await withHarness(flavour) { h in
            try h.store.put("a")
            try h.startRelay(heartbeat: .milliseconds(150))
            try await h.eventually("the first change") { h.published.count == 1 }
            let requests = h.store.feedRequests.count
            // Idle for ten times the heartbeat: the heartbeats keep the connection alive.
            try await Task.sleep(for: .milliseconds(1500))
            try h.store.put("b")
            try await h.eventually("the change after the idle time") { h.published.count == 2 }
            #expect(h.store.feedRequests.count == requests)
        }
    }

    @Test(arguments: [
        FeedCase(flavour: .opaque, feed: .continuous), FeedCase(flavour: .integer, feed: .eventsource),
        FeedCase(flavour: .syncGateway, feed: .longpoll),
    ])
    func missingHeartbeatReconnectsFromTheConfirmedPosition(_ feedCase: FeedCase) async throws {
        try await withHarness(feedCase.flavour) { h in
            try h.store.put("a")
            try h.startRelay(feed: feedCase.feed, heartbeat: .milliseconds(150))
            try await h.eventually("the first change") { h.published.count == 1 }
            try await h.eventually("the checkpoint") { (try? h.checkpoint.load()) != nil }
            try await Task.sleep(for: .milliseconds(100))
            let requests = h.store.feedRequests.count
            let checkpoint = try #require(try h.checkpoint.load())
            h.store.muteOpenFeeds()
            try h.store.put("b")
            try await h.eventually("the change after the reconnect") { h.publishedIDs.contains("b") }
            #expect(h.store.feedRequests.count > requests)
            #expect(h.store.feedRequests.dropFirst(requests).first == checkpoint.position)
            #expect(h.publishedIDs.filter { $0 == "a" }.count >= 1)
        }
    }

    @Test(arguments: [
        FeedCase(flavour: .integer, feed: .continuous), FeedCase(flavour: .opaque, feed: .continuous),
        FeedCase(flavour: .syncGateway, feed: .continuous), FeedCase(flavour: .opaque, feed: .eventsource),
        FeedCase(flavour: .opaque, feed: .longpoll),
    ])
    func droppedConnectionMidLineResumesWithoutAGap(_ feedCase: FeedCase) async throws {
        try await withHarness(feedCase.flavour) { h in
            try h.startRelay(feed: feedCase.feed, heartbeat: .milliseconds(150))
            try await h.eventually("the feed") { h.store.feedRequests.count >= 1 }
            // The next feed (after the open one falls silent) is cut after 9 rows, in the middle of the 10th.
            var faults = CouchDBFakeStore.Faults()
            faults.dropAfterRows = 9
            faults.dropMidLine = true
            h.store.setFaults(faults)
            h.store.muteOpenFeeds()
            for i in 0..<20 { try h.store.put("d\(i)") }
            try await h.eventually("all 20 documents") { Set(h.publishedIDs).count == 20 }
            let requests = Array(h.store.feedRequests.dropFirst(1))
            #expect(requests.count >= 2)
            // The reconnect after the cut asked for what was confirmed (a position in a checkpoint), or the start.
            let resumedFrom = requests.count >= 2 ? requests[1] : ""
            let seqs = Set(h.published.map { $0["seq"]!.stringValue! })
            #expect(resumedFrom == "0" || seqs.contains(resumedFrom), "\(resumedFrom)")
            // First deliveries come in feed order: no gap, nothing out of order.
            var firstSeen: [String] = []
            for id in h.publishedIDs where !firstSeen.contains(id) { firstSeen.append(id) }
            #expect(firstSeen == (0..<20).map { "d\($0)" })
            h.expectStableKeys()
        }
    }

    @Test(arguments: [
        FeedCase(flavour: .opaque, feed: .continuous), FeedCase(flavour: .integer, feed: .eventsource),
        FeedCase(flavour: .opaque, feed: .longpoll),
    ])
    func malformedRowReconnectsWithoutAGap(_ feedCase: FeedCase) async throws {
        try await withHarness(feedCase.flavour) { h in
            try h.startRelay(feed: feedCase.feed, heartbeat: .milliseconds(150))
            try await h.eventually("the feed") { h.store.feedRequests.count >= 1 }
            var faults = CouchDBFakeStore.Faults()
            faults.garbageAfterRows = 3
            h.store.setFaults(faults)
            h.store.muteOpenFeeds()
            for i in 0..<8 { try h.store.put("d\(i)") }
            try await h.eventually("all 8 documents") { Set(h.publishedIDs).count == 8 }
            // The bad line ended that connection: one more request than the muted feed and its successor.
            #expect(h.store.feedRequests.count >= 3)
            var firstSeen: [String] = []
            for id in h.publishedIDs where !firstSeen.contains(id) { firstSeen.append(id) }
            #expect(firstSeen == (0..<8).map { "d\($0)" })
            h.expectStableKeys()
        }
    }

    @Test(arguments: [CouchDBFakeStore.Flavour.integer, .opaque])
    func sinceNowSkipsTheHistoryAndIsPinnedBeforeTheFirstConfirm(_ flavour: CouchDBFakeStore.Flavour) async throws {
        try await withHarness(flavour) { h in
            var logger = Logger(label: "test")
            logger.logLevel = .critical
            try h.store.put("old")
            let source = CouchDBChangeSource(
                configuration: .init(
                    url: try CouchDBURL(h.fake.url), heartbeat: .milliseconds(150), initialSince: "now"),
                logger: logger)
            try await source.start(after: nil)
            try await h.eventually("the feed") { h.store.feedRequests.count >= 2 }
            // The feed was opened with the seq `now` stood for, not with `now`.
            #expect(h.store.feedRequests == ["now", h.store.flavour == .integer ? "1" : h.store.feedRequests[1]])
            #expect(h.store.feedRequests[1] != "now" && h.store.feedRequests[1] != "0")
            try h.store.put("new")
            var ids: [String?] = []
            for _ in 0..<40 where ids.isEmpty { ids += try await source.next()?.changes.map(\.id) ?? [] }
            #expect(ids == ["new"])
            await source.close()
        }
    }

    @Test func designFilterIsPassedThrough() async throws {
        try await withHarness(.opaque) { h in
            let configuration = CouchDBChangeSource.Configuration(
                url: try CouchDBURL(h.fake.url), heartbeat: .milliseconds(200), filter: "app/important")
            var logger = Logger(label: "test")
            logger.logLevel = .critical
            try h.store.put("a", ["important": true])
            try h.store.put("b")
            try h.store.put("c", ["important": true])
            let source = CouchDBChangeSource(configuration: configuration, logger: logger)
            try await source.start(after: nil)
            var ids: [String?] = []
            for _ in 0..<40 where ids.count < 2 { ids += try await source.next()?.changes.map(\.id) ?? [] }
            #expect(ids == ["a", "c"])
            await source.close()
        }
    }

    @Test(arguments: [CouchDBFakeStore.Flavour.integer, .opaque, .syncGateway])
    func replayedRangeComesWithTheSameKeys(_ flavour: CouchDBFakeStore.Flavour) async throws {
        try await withHarness(flavour) { h in
            for i in 0..<6 { try h.store.put("d\(i)") }
            try h.startRelay(heartbeat: .milliseconds(150))
            try await h.eventually("the first sync") { h.published.count == 6 }
            try await h.eventually("the checkpoint") {
                (try? h.checkpoint.load())?.position == h.published.last!["seq"]!.stringValue
            }
            var faults = CouchDBFakeStore.Faults()
            faults.replayRows = 3
            h.store.setFaults(faults)
            h.store.muteOpenFeeds()
            try h.store.put("d6")
            try await h.eventually("the new change") { h.publishedIDs.contains("d6") }
            #expect(h.publishedIDs == ["d0", "d1", "d2", "d3", "d4", "d5", "d3", "d4", "d5", "d6"])
            h.expectStableKeys()
            let keys = h.published.map { $0["key"]!.stringValue! }
            #expect(keys[3...5] == keys[6...8])
        }
    }

    @Test(arguments: [
        FeedCase(flavour: .integer, feed: .continuous), FeedCase(flavour: .opaque, feed: .continuous),
        FeedCase(flavour: .syncGateway, feed: .continuous), FeedCase(flavour: .opaque, feed: .longpoll),
    ])
    func unknownSinceStartsAFullResync(_ feedCase: FeedCase) async throws {
        try await withHarness(feedCase.flavour) { h in
            for i in 0..<3 { try h.store.put("d\(i)") }
            try h.startRelay(feed: feedCase.feed)
            try await h.eventually("the first sync") { h.published.count == 3 }
            try await h.eventually("the checkpoint") {
                (try? h.checkpoint.load())?.position == h.published.last!["seq"]!.stringValue
            }
            await h.stopRelays()
            try h.store.put("d3")
            h.store.forgetHistory()
            let source = try h.startRelay(feed: feedCase.feed)
            try await h.eventually("the snapshot") { h.published.count >= 7 }
            let batches = source.batches.withLockedValue { $0 }
            let first = try #require(batches.first)
            #expect(first.resync?.reason.contains("400") == true)
            #expect(first.changes.first?.extra["resync"] == true)
            #expect(batches.dropFirst().allSatisfy { $0.resync == nil })
            let snapshot = Array(h.published.dropFirst(3))
            #expect(snapshot.map { $0["id"]!.stringValue! } == ["d0", "d1", "d2", "d3"])
            #expect(snapshot.allSatisfy { $0["resync"] == true })
            // After the snapshot the feed is followed again, live changes are not marked.
            try h.store.put("d4")
            try await h.eventually("the live change after the resync") { h.publishedIDs.last == "d4" }
            #expect(h.published.last?["resync"] == nil)
        }
    }

    /// A resync over 25 rows in pages of 7: the first page is cut mid-body and read again, the relay stops after
    /// confirming two batches, and a new source resumes from that snapshot seq and follows the feed.
    @Test(arguments: [CouchDBFakeStore.Flavour.integer, .opaque, .syncGateway])
    func pagedResyncResumesFromTheSnapshotSeqAfterACutAndARestart(_ flavour: CouchDBFakeStore.Flavour) async throws {
        try await withHarness(flavour) { h in
            var logger = Logger(label: "test")
            logger.logLevel = .critical
            for i in 0..<5 { try h.store.put("d\(i)") }
            h.store.forgetHistory()
            for i in 5..<25 { try h.store.put("d\(i)") }
            let configuration = CouchDBChangeSource.Configuration(
                url: try CouchDBURL(h.fake.url), heartbeat: .milliseconds(200), maxBatch: 7, bufferCapacity: 7)
            var faults = CouchDBFakeStore.Faults()
            faults.dropAfterRows = 3
            h.store.setFaults(faults)

            // What the relay does: take a batch, confirm it; stop after two batches with changes, past the rows
            // whose sequences the server forgot (d0–d4: a Sync Gateway answers 400 to a resume from one of them,
            // and the relay would resync again; batches taken early in the cut first page can end there).
            let forgotten = flavour == .opaque ? "2-g1AAAAforgotten" : "2"
            let first = CouchDBChangeSource(configuration: configuration, logger: logger)
            try await first.start(after: forgotten)
            var batches: [ChangeBatch] = []
            let deadline = ContinuousClock.now + .seconds(20)
            while (batches.filter({ !$0.changes.isEmpty }).count < 2 || batches.flatMap(\.changes).count < 6)
                && ContinuousClock.now < deadline
            {
                guard let batch = try await first.next() else { continue }
                batches.append(batch)
                try await first.confirm(batch.position)
            }
            await first.close()
            let checkpoint = try #require(batches.last?.position)
            #expect(batches.first?.resync?.reason.contains("400") == true)
            #expect(batches.dropFirst().allSatisfy { $0.resync == nil })
            let snapshot = batches.flatMap(\.changes)
            #expect(snapshot.allSatisfy { $0.extra["resync"] == true })
            // Batches hold what was read when they were taken (at most a page): stopped inside the snapshot.
            let stoppedAt = snapshot.count
            #expect(stoppedAt >= 6 && stoppedAt <= 14)
            #expect(snapshot.map(\.id) == (0..<stoppedAt).map { "d\($0)" })
            #expect(checkpoint == snapshot.last?.seq)

            // The restart resumes from the snapshot seq (a position the server knows), then follows the feed.
            let requests = h.store.feedRequests.count
            let second = CouchDBChangeSource(configuration: configuration, logger: logger)
            try await second.start(after: checkpoint)
            try h.store.put("d25")
            var rest: [Change] = []
            while rest.last?.id != "d25" && ContinuousClock.now < deadline {
                guard let batch = try await second.next() else { continue }
                #expect(batch.resync == nil)
                rest += batch.changes
                try await second.confirm(batch.position)
            }
            await second.close()
            #expect(h.store.feedRequests.dropFirst(requests).first == checkpoint)
            #expect(rest.map(\.id) == (stoppedAt..<26).map { "d\($0)" })

            // Every snapshot read was one page: feed=normal with limit=7, from 0 or the last page's seq.
            let pages = h.store.feedQueries.filter { $0.contains("feed=normal") }
            #expect(pages.count >= 3)
            #expect(pages.allSatisfy { $0.contains("limit=7") })
            // The cut first page was asked for again from 0 (nothing of it was confirmed).
            #expect(pages.filter { $0.contains("since=0&") }.count == 2)
        }
    }

    @Test func syncGatewayChannelsAndRemovedOnAKeyspace() async throws {
        try await withHarness(.syncGateway, database: "travel.inventory.hotels") { h in
            let rev = try h.store.put("h1", ["channels": ["paris"]])
            try h.store.put("h2", ["channels": ["rome"]])
            try h.startRelay(channels: ["paris"])
            try await h.eventually("the paris document") { h.published.count == 1 }
            try h.store.put("h1", ["channels": ["rome"]], rev: rev)
            try await h.eventually("the removal") { h.published.count == 2 }
            let removal = h.published[1]
            #expect(removal["id"] == "h1" && removal["op"] == "delete" && removal["removed"] == ["paris"])
            #expect(removal["collection"] == "travel.inventory.hotels")
            let channel = ChangeMapping().channel(
                for: Change(
                    collection: ["travel", "inventory", "hotels"], id: "h1",
                    operation: .delete, seq: "1"))
            #expect(h.publisher.published.withLockedValue { $0[1].channel } == channel)
            #expect(!h.publishedIDs.contains("h2"))
        }
    }

    @Test func basicAuthFromTheURL() async throws {
        let fake = try await CouchDBFake.start(store: CouchDBFakeStore(flavour: .integer, credentials: "relay:s3cr:t"))
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        try fake.store.put("a")
        let refused = CouchDBChangeSource(
            configuration: .init(url: try CouchDBURL("http://relay:wrong@127.0.0.1:\(fake.port)/db")), logger: logger)
        let error = await expectRelayError(.source) { try await refused.start(after: nil) }
        #expect(error?.message.contains("authentication refused") == true)
        await refused.close()
        let source = CouchDBChangeSource(
            configuration: .init(
                url: try CouchDBURL("http://relay:s3cr%3At@127.0.0.1:\(fake.port)/db"),
                heartbeat: .milliseconds(200)), logger: logger)
        try await source.start(after: nil)
        var batch: ChangeBatch?
        for _ in 0..<40 where batch == nil { batch = try await source.next() }
        #expect(batch?.changes.map(\.id) == ["a"] && batch?.position == "1")
        await source.close()
        await fake.stop()
    }

    @Test func unreachableOrMissingDatabaseFailsTheStart() async throws {
        try await withHarness(.opaque) { h in
            var logger = Logger(label: "test")
            logger.logLevel = .critical
            let missing = CouchDBChangeSource(
                configuration: .init(url: try CouchDBURL("http://127.0.0.1:\(h.fake.port)/nope")), logger: logger)
            await expectRelayError(.source) { try await missing.start(after: nil) }
            await missing.close()
            let down = CouchDBChangeSource(
                configuration: .init(url: try CouchDBURL("http://127.0.0.1:1/db")), logger: logger)
            await expectRelayError(.source) { try await down.start(after: nil) }
            await down.close()
        }
    }
}
