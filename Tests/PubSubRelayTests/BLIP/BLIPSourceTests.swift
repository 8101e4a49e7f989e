import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import RelayFakes
import Testing

@testable import PubSubRelay

/// The BLIP source against the fake Sync Gateway over real sockets, driven by the real `Relay` with a file
/// checkpoint and a fake broker.
@Suite(.serialized, .timeLimit(.minutes(2))) struct BLIPSourceTests {
    static let quiet = Logger(label: "test.blip") { _ in SwiftLogNoOpLogHandler() }

    /// A running fake and where it listens.
    struct Server {
        let fake: BLIPFake
        let task: Task<Void, any Error>
        let port: Int

        static func start(_ options: BLIPFake.Options = .init()) async throws -> Server {
            let fake = BLIPFake(options: options, logger: quiet)
            let port = NIOLockedValueBox<Int?>(nil)
            let task = Task { try await fake.run(port: 0) { bound in port.withLockedValue { $0 = bound } } }
            try await eventually("the fake listens") { port.withLockedValue { $0 } != nil }
            return Server(fake: fake, task: task, port: port.withLockedValue { $0 }!)
        }

        func source(
            batch: Int = 200, channels: [String] = [], user: String? = nil,
            heartbeat: Duration = .seconds(5)
        ) throws -> BLIPChangeSource {
            let url = try BLIPURL("ws://\(user.map { "\($0):secret@" } ?? "")127.0.0.1:\(port)/db")
            return BLIPChangeSource(
                configuration: .init(
                    url: url, channels: channels, batch: batch,
                    heartbeat: heartbeat, reconnectDelay: .milliseconds(20)),
                logger: quiet)
        }

        func stop() async {
            task.cancel()
            _ = await task.result
        }
    }

    /// One relay run: the real relay loop in a task.
    struct Running {
        let source: BLIPChangeSource
        let task: Task<Void, any Error>

        static func start(_ source: BLIPChangeSource, _ publisher: FakePublisher, checkpoint: String) -> Running {
            let relay = Relay(
                source: source, publisher: publisher, store: FileCheckpointStore(path: checkpoint),
                logger: quiet)
            return Running(source: source, task: Task { try await relay.run() })
        }

        func stop() async throws {
            task.cancel()
            let result = await task.result
            await source.close()
            if case .failure(let error) = result, !(error is CancellationError) { throw error }
        }
    }

    static func eventually(_ what: String, timeout: Duration = .seconds(30), _ condition: () async -> Bool) async throws
    {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if await condition() { return }
            try await Task.sleep(for: .milliseconds(10))
        }
        Issue.record("timed out waiting for \(what)")
        throw CancellationError()
    }

    func fakeID(_ index: Int, _ part: Int) -> String {
        var hash = UInt64(truncatingIfNeeded: index &* 7919 &+ part &* 104_729) &+ 0x9E37_79B9_7F4A_7C15
        hash = (hash ^ (hash >> 31)) &* 0xBF58_476D_1CE4_E5B9
        return String(hash ^ (hash >> 29), radix: 36)
    }

    func ids(_ publisher: FakePublisher) -> [String] {
        publisher.published.withLockedValue { $0.map { $0.data.objectValue!["id"]!.stringValue! } }
    }

    @Test func firstSyncCaughtUpThenLiveChangesAnsweredOnlyAfterPersisting() async throws {
        let server = try await Server.start()
        defer { Task { await server.stop() } }
        server.fake.put("a")
        server.fake.put("b")
        server.fake.put("b")  // b at generation 2: one entry, an update
        server.fake.put("c/d e")
        server.fake.put("c/d e", deleted: true)
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        let source = try server.source(user: "user")
        let run = Running.start(source, publisher, checkpoint: directory + "/checkpoint")
        try await Self.eventually("the first sync") { ids(publisher).count == 3 }
        // Live: after the caught-up [] the connection stays open and new revisions arrive.
        let seq = server.fake.put("live")
        try await Self.eventually("the live change") { ids(publisher).count == 4 }
        try await Self.eventually("every changes message answered") {
            server.fake.changesAnswered == server.fake.changesSent
        }
        try await run.stop()

        let messages = publisher.published.withLockedValue { $0 }
        #expect(
            messages.map(\.channel) == ["/changes/db/a", "/changes/db/b", "/changes/db/c$2Fd$20e", "/changes/db/live"])
        let data = messages.map { $0.data.objectValue! }
        #expect(data.map { $0["op"]!.stringValue! } == ["insert", "update", "delete", "insert"])
        #expect(data.map { $0["seq"]!.stringValue! } == ["1", "3", "5", "\(seq)"])
        #expect(data[1]["rev"]!.stringValue!.hasPrefix("2-"))
        #expect(data.allSatisfy { $0["source"] == .string("blip:127.0.0.1:\(server.port)/db") })
        #expect(Set(messages.map(\.key)).count == 4)
        let checkpoint = try FileCheckpointStore(path: directory + "/checkpoint").load()
        #expect(checkpoint?.position == "\(seq)")
        #expect(server.fake.subscriptions == [nil])
        #expect(server.fake.subprotocols == ["BLIP_3+CBMobile_3"])
        #expect(server.fake.authorizations == ["Basic dXNlcjpzZWNyZXQ="])  // base64("user:secret")
        #expect(server.fake.protocolErrors == [])
    }

    @Test func nothingIsAnsweredWhileTheBrokerDoesNotAcknowledge() async throws {
        let server = try await Server.start()
        defer { Task { await server.stop() } }
        for index in 0..<3 { server.fake.put("doc\(index)") }
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let journal = Journal()
        let publisher = FakePublisher(journal: journal, failures: 1_000_000)
        let run = Running.start(try server.source(), publisher, checkpoint: directory + "/checkpoint")
        try await Self.eventually("publish attempts") { journal.events.filter { $0 == "publish failed" }.count >= 3 }
        try await run.stop()
        #expect(server.fake.changesSent == 1)
        #expect(server.fake.changesAnswered == 0)
        #expect(try FileCheckpointStore(path: directory + "/checkpoint").load() == nil)
    }

    @Test func droppedConnectionsResumeFromTheConfirmedPositionWithoutAGap() async throws {
        let server = try await Server.start()
        defer { Task { await server.stop() } }
        for index in 0..<60 { server.fake.put("doc\(index)") }
        server.fake.dropAfter(messages: 3)
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        var run = Running.start(try server.source(batch: 5), publisher, checkpoint: directory + "/checkpoint")
        try await Self.eventually("all 60 documents") { Set(ids(publisher)).count == 60 }
        #expect(server.fake.subscriptions.count >= 2)
        // The drop came after 3 messages of 5 entries were answered: the second subscription resumed after them.
        #expect(server.fake.subscriptions.prefix(2) == [nil, "15"])
        try await Self.eventually("the checkpoint at 60") {
            (try? FileCheckpointStore(path: directory + "/checkpoint").load())??.position == "60"
        }
        try await run.stop()

        // Restart from the checkpoint: only what came after it is delivered.
        let checkpoint = try #require(try FileCheckpointStore(path: directory + "/checkpoint").load())
        #expect(checkpoint.position == "60")
        for index in 60..<70 { server.fake.put("doc\(index)") }
        server.fake.dropConnections()
        let again = FakePublisher(journal: Journal())
        run = Running.start(try server.source(batch: 5), again, checkpoint: directory + "/checkpoint")
        try await Self.eventually("the 10 new documents") { Set(ids(again)).count == 10 }
        try await run.stop()
        #expect(Set(ids(again)) == Set((60..<70).map { "doc\($0)" }))
        #expect(server.fake.subscriptions.last == "60")
    }

    @Test func anUnknownSinceStartsAFullResyncAndSaysSo() async throws {
        let server = try await Server.start()
        defer { Task { await server.stop() } }
        server.fake.put("a")
        server.fake.put("b")
        server.fake.forgetHistory()
        server.fake.put("c")
        let source = try server.source()
        try await source.start(after: "1")
        var batches: [ChangeBatch] = []
        try await Self.eventually("the resync batch") {
            if let batch = try? await source.next() {
                batches.append(batch)
                try? await source.confirm(batch.position)
            }
            return batches.flatMap(\.changes).count >= 3
        }
        await source.close()
        let resync = try #require(batches.first?.resync)
        #expect(resync.reason.contains("since=1"))
        #expect(resync.reason.contains("HTTP 400 Invalid sequence"))
        let changes = batches.flatMap(\.changes)
        #expect(changes.map { $0.id! } == ["a", "b", "c"])
        #expect(changes.allSatisfy { $0.extra["resync"] == .bool(true) })
        #expect(batches.dropFirst().allSatisfy { $0.resync == nil })
        #expect(server.fake.subscriptions == ["1", nil])
    }

    @Test func compressedAndMultiFrameMessagesWithACKs() async throws {
        let server = try await Server.start(.init(framePayload: 1000, compress: true))
        defer { Task { await server.stop() } }
        // Long, hardly compressible ids: one changes message is far more than 50000 bytes even deflated.
        func id(_ index: Int) -> String { (0..<12).map { fakeID(index, $0) }.joined(separator: "-") }
        for index in 0..<800 { server.fake.put(id(index)) }
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        let run = Running.start(try server.source(batch: 800), publisher, checkpoint: directory + "/checkpoint")
        try await Self.eventually("all 800 documents") { Set(ids(publisher)).count == 800 }
        server.fake.put("after")
        try await Self.eventually("a live change after compressed frames") { ids(publisher).contains("after") }
        try await run.stop()
        // One changes message of 800 entries is ~190 KB: split into ~190 frames, and ACKed by the client.
        #expect(server.fake.acksReceived >= 1)
        #expect(server.fake.protocolErrors == [])
        #expect(server.fake.subscriptions == [nil])
    }

    @Test func channelFilterIsSentAndApplied() async throws {
        let server = try await Server.start()
        defer { Task { await server.stop() } }
        server.fake.put("red1", channels: ["red"])
        server.fake.put("blue1", channels: ["blue"])
        server.fake.put("red2", channels: ["red", "green"])
        let source = try server.source(channels: ["red"])
        try await source.start(after: nil)
        var ids: [String] = []
        try await Self.eventually("the red documents") {
            if let batch = try? await source.next() {
                ids += batch.changes.map { $0.id! }
                try? await source.confirm(batch.position)
            }
            return ids.count >= 2
        }
        await source.close()
        #expect(ids == ["red1", "red2"])
    }

    @Test func aMissingHeartbeatReconnectsFromTheConfirmedPosition() async throws {
        let server = try await Server.start()
        defer { Task { await server.stop() } }
        for index in 0..<5 { server.fake.put("doc\(index)") }
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        let run = Running.start(
            try server.source(heartbeat: .milliseconds(200)), publisher,
            checkpoint: directory + "/checkpoint")
        try await Self.eventually("the first sync") { ids(publisher).count == 5 && server.fake.changesAnswered == 1 }
        // The peer goes silent (no pong, no FIN): the client's pings go unanswered and it reconnects.
        server.fake.stallConnections()
        server.fake.put("after")
        try await Self.eventually("a reconnect and the next change") { ids(publisher).contains("after") }
        try await run.stop()
        #expect(server.fake.subscriptions == [nil, "5"])
        #expect(ids(publisher) == ["doc0", "doc1", "doc2", "doc3", "doc4", "after"])
    }

    @Test func aCorruptFrameClosesTheConnectionAndTheSourceReconnects() async throws {
        let server = try await Server.start()
        defer { Task { await server.stop() } }
        server.fake.put("one")
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        let run = Running.start(try server.source(), publisher, checkpoint: directory + "/checkpoint")
        try await Self.eventually("the first change answered") { server.fake.changesAnswered == 1 }
        server.fake.sendCorruptFrame()
        try await Self.eventually("a second subscription") { server.fake.subscriptions.count == 2 }
        server.fake.put("two")
        try await Self.eventually("the next change") { ids(publisher).contains("two") }
        try await Self.eventually("the second change answered") { server.fake.changesAnswered == 2 }
        // Well framed, but the body is not JSON: also closed, and resumed.
        server.fake.sendMalformedChanges()
        try await Self.eventually("a third subscription") { server.fake.subscriptions.count == 3 }
        server.fake.put("three")
        try await Self.eventually("the change after that") { ids(publisher).contains("three") }
        try await run.stop()
        #expect(server.fake.subscriptions == [nil, "1", "2"])
        #expect(ids(publisher) == ["one", "two", "three"])
    }

    @Test func includeDocumentsAsksForRevisionsAndCarriesTheirBodies() async throws {
        let server = try await Server.start()
        defer { Task { await server.stop() } }
        server.fake.put("a")
        server.fake.put("b")
        server.fake.put("b", deleted: true)
        let url = try BLIPURL("ws://127.0.0.1:\(server.port)/db")
        let source = BLIPChangeSource(configuration: .init(url: url, includeDocuments: true), logger: Self.quiet)
        try await source.start(after: nil)
        var changes: [Change] = []
        try await Self.eventually("both documents") {
            if let batch = try? await source.next() {
                changes += batch.changes
                try? await source.confirm(batch.position)
            }
            return changes.count >= 2
        }
        await source.close()
        #expect(changes.map { $0.id! } == ["a", "b"])
        #expect(changes[0].document == ["_id": "a", "_rev": .string(changes[0].extra["rev"]!.stringValue!), "seq": 1])
        #expect(changes[1].operation == .delete && changes[1].document == ["_deleted": true])
        #expect(server.fake.revsSent == 2)
    }

    @Test func configurationFileFeeds() throws {
        let settings = FeedSettings(
            [
                "source": "blip", "sg_url": "ws://u:p@sg.local:4984/db", "channel": ["a", "b"],
                "batch": 10, "active_only": true,
            ], context: "feeds[0]")
        let source = try FeedKind.blip.makeSource(settings, logger: Self.quiet)
        #expect(source.sourceID == "blip:sg.local:4984/db")
        let configuration = try BLIPChangeSource.Configuration(settings: settings)
        #expect(configuration.channels == ["a", "b"] && configuration.batch == 10 && configuration.activeOnly)
        #expect(configuration.url.basicAuthorization == "Basic dTpw")  // base64("u:p")
        #expect {
            try FeedKind.blip.makeSource(
                FeedSettings(["sg_url": "http://x/db"], context: "feeds[1]"), logger: Self.quiet)
        } throws: { "\($0)".hasPrefix("feeds[1].sg_url: ") }
        #expect {
            try FeedKind.blip.makeSource(
                FeedSettings(["sg_url": "ws://x/db", "bach": 1], context: "feeds[2]"), logger: Self.quiet)
        } throws: { "\($0)".hasPrefix("feeds[2].bach: unknown setting") }
    }

    @Test func badURLsAreRefused() {
        expectRelayError(.invalidURL) { try BLIPURL("http://host/db") }
        expectRelayError(.invalidURL) { try BLIPURL("ws://host:4984/") }
        expectRelayError(.invalidURL) { try BLIPURL("ws://host:99999/db") }
        expectRelayError(.invalidURL) { try BLIPURL("ws://host/a/b") }
        let url = try? BLIPURL("wss://me:p%40ss@sg.example:4984/db/_blipsync")
        #expect(url?.endpoint == "wss://sg.example:4984/db/_blipsync")
        #expect(url?.password == "p@ss")
        #expect(url?.description == "wss://sg.example:4984/db")
    }
}
