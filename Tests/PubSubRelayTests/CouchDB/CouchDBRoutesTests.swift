import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import RelayFakes
import Testing

@testable import PubSubRelay

#if canImport(Glibc)
    import Glibc
#endif

/// The real relay loop with routes over a document source, its checkpoint and audience memory in `directory`, as
/// `pubsub relay <source> --route …` runs it. Also used by the BLIP and Simperium route tests.
struct RoutedRelay {
    static let quiet = Logger(label: "test.routes") { _ in SwiftLogNoOpLogHandler() }

    let source: any ChangeSource
    let task: Task<Void, any Error>

    static func start(
        _ source: any ChangeSource, routes: [Route], publisher: FakePublisher, directory: String,
        includeDocument: Bool = false, memory: Int = 100
    ) -> RoutedRelay {
        let relay = Relay(
            source: source, publisher: publisher, store: FileCheckpointStore(path: directory + "/checkpoint"),
            configuration: .init(
                mapping: ChangeMapping(includeDocument: includeDocument, routes: routes),
                audiencePath: directory + "/checkpoint.audience", rememberedDocuments: memory),
            logger: quiet)
        return RoutedRelay(source: source, task: Task { try await relay.run() })
    }

    /// Stops the relay once everything published is checkpointed, so that a relay started next does not publish
    /// the last batch again.
    func stop(directory: String, publisher: FakePublisher) async throws {
        let last = publisher.published.withLockedValue { $0.last?.data.objectValue?["seq"]?.stringValue }
        if let last {
            try await eventually("the checkpoint at \(last)") {
                (try? FileCheckpointStore(path: directory + "/checkpoint").load())?.position == last
            }
        }
        task.cancel()
        let result = await task.result
        await source.close()
        if case .failure(let error) = result, !(error is CancellationError) { throw error }
    }

    /// `op id channel [audience] [doc]` for every message published so far.
    static func lines(_ publisher: FakePublisher) -> [String] {
        publisher.published.withLockedValue { messages in
            messages.map { message in
                let data = message.data.objectValue!
                var line = "\(data["op"]!.stringValue!) \(data["id"]!.stringValue!) \(message.channel)"
                if let audience = data["audience"]?.stringValue { line += " " + audience }
                if data["doc"] != nil { line += " doc" }
                return line
            }
        }
    }

    /// Waits until `count` messages were published.
    static func waitFor(_ count: Int, _ publisher: FakePublisher, _ what: String) async throws {
        try await eventually("\(what) (\(count) messages; have \(lines(publisher)))") {
            publisher.published.withLockedValue { $0.count } >= count
        }
    }
}

/// `pubsub relay couchdb --route`: with routes the source reads documents (`include_docs=true`) without
/// `--include-doc`, each change goes to its document's audience only, a move tells the old audience first, and a
/// tombstone goes where the document was, by the values remembered across a restart, else by its own fields.
@Suite(.serialized, .timeLimit(.minutes(1))) struct CouchDBRoutesTests {
    static let routes = [
        try! Route(parsing: "db=/users/{doc.owner}/notes"), try! Route(parsing: "db=/users/{doc.members[]}/shared"),
    ]

    static func source(_ fake: CouchDBFake, feed: CouchDBChangeSource.Feed) throws -> CouchDBChangeSource {
        // What `pubsub relay couchdb --route …` gives the source: routes need the documents.
        let settings = FeedSettings(
            [
                "db_url": .string(fake.url), "feed": .string(feed.rawValue), "heartbeat": 200,
                "route": .array(routes.map { .string($0.description) }),
            ], context: "feeds[0]")
        var configuration = try CouchDBChangeSource.Configuration(settings: settings)
        configuration.maxBatch = 3
        return CouchDBChangeSource(configuration: configuration, logger: RoutedRelay.quiet)
    }

    @Test func routesReadTheDocumentsWithoutIncludeDoc() throws {
        let settings = FeedSettings(
            ["db_url": "http://127.0.0.1:5984/db", "route": "db=/users/{doc.owner}/notes"],
            context: "feeds[0]")
        #expect(try CouchDBChangeSource.Configuration(settings: settings).includeDocs)
        let plain = try CouchDBChangeSource.Configuration(
            settings: FeedSettings(["db_url": "http://127.0.0.1:5984/db"], context: "feeds[0]"))
        #expect(!plain.includeDocs)
    }

    @Test(arguments: [
        FeedCase(flavour: .opaque, feed: .continuous), FeedCase(flavour: .integer, feed: .longpoll),
        FeedCase(flavour: .syncGateway, feed: .continuous),
    ])
    func eachDocumentReachesItsAudienceAcrossAMoveARestartAndATombstone(_ feedCase: FeedCase) async throws {
        let fake = try await CouchDBFake.start(store: CouchDBFakeStore(flavour: feedCase.flavour))
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        let store = fake.store
        do {
            var relay = RoutedRelay.start(
                try Self.source(fake, feed: feedCase.feed), routes: Self.routes,
                publisher: publisher, directory: directory)
            var rev = try store.put("n1", ["owner": "a", "body": "1"])
            try await RoutedRelay.waitFor(1, publisher, "the insert")
            rev = try store.put("n1", ["owner": "a", "body": "2"], rev: rev)
            try await RoutedRelay.waitFor(2, publisher, "the update")
            rev = try store.put("n1", ["owner": "b", "body": "3"], rev: rev)
            try await RoutedRelay.waitFor(4, publisher, "the move")
            try store.put("s1", ["owner": "b", "members": ["a", "b", "a", .null]])
            try await RoutedRelay.waitFor(7, publisher, "the shared document")
            // A new relay process: what it remembers of n1 (owner b) comes from <checkpoint>.audience.
            try await relay.stop(directory: directory, publisher: publisher)
            relay = RoutedRelay.start(
                try Self.source(fake, feed: feedCase.feed), routes: Self.routes,
                publisher: publisher, directory: directory)
            try store.delete("n1", rev: rev)
            try await RoutedRelay.waitFor(8, publisher, "the delete")
            try await relay.stop(directory: directory, publisher: publisher)
        } catch {
            await fake.stop()
            throw error
        }
        await fake.stop()
        #expect(!store.feedQueries.isEmpty && store.feedQueries.allSatisfy { $0.contains("include_docs=true") })
        #expect(
            RoutedRelay.lines(publisher) == [
                "insert n1 /users/a/notes",
                "update n1 /users/a/notes",
                "update n1 /users/a/notes left",
                "update n1 /users/b/notes joined",
                "insert s1 /users/b/notes",
                "insert s1 /users/a/shared",
                "insert s1 /users/b/shared",
                "delete n1 /users/b/notes",
            ])
    }

    /// CouchDB keeps a tombstone's fields when a document is deleted with a body (`{"_deleted": true, "owner": …}`).
    /// The remembered values come first (the audience that had the document); a tombstone the relay remembers nothing
    /// of goes by its own fields, and one without fields goes nowhere (counted as `no_previous`).
    @Test func aTombstoneGoesByTheRememberedValuesElseByItsOwnFields() async throws {
        let fake = try await CouchDBFake.start(store: CouchDBFakeStore(flavour: .opaque))
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        let store = fake.store
        do {
            // Before the relay ever ran: it sees only the tombstones (a feed keeps the latest change of each).
            try store.delete("kept", rev: try store.put("kept", ["owner": "c"]), body: ["owner": "c"])
            try store.delete("bare", rev: try store.put("bare", ["owner": "c"]))
            try store.put("marker", ["owner": "m"])
            let relay = RoutedRelay.start(
                try Self.source(fake, feed: .continuous), routes: Self.routes,
                publisher: publisher, directory: directory)
            try await RoutedRelay.waitFor(2, publisher, "the first sync")
            let rev = try store.put("moved", ["owner": "a"])
            try await RoutedRelay.waitFor(3, publisher, "the insert")
            try store.delete("moved", rev: rev, body: ["owner": "z"])
            try await RoutedRelay.waitFor(4, publisher, "the delete")
            try await relay.stop(directory: directory, publisher: publisher)
        } catch {
            await fake.stop()
            throw error
        }
        await fake.stop()
        #expect(
            RoutedRelay.lines(publisher) == [
                "delete kept /users/c/notes",
                "insert marker /users/m/notes",
                "insert moved /users/a/notes",
                "delete moved /users/a/notes",
            ])
    }
}
