import Bayeux
import Logging
import RelayFakes
import Testing

@testable import PubSubRelay

#if canImport(Glibc)
    import Glibc
#endif

/// `pubsub relay blip --route`: with routes the source asks Sync Gateway for every revision's body (its reply to
/// `changes` is `[[], …]`, and the bodies come in `rev` messages) without `--include-doc`; each change goes to its
/// document's audience only, across a move, a restart and a tombstone.
@Suite(.serialized, .timeLimit(.minutes(1))) struct BLIPRoutesTests {
    static let routes = [
        try! Route(parsing: "db=/users/{doc.owner}/notes"), try! Route(parsing: "db=/users/{doc.members[]}/shared"),
    ]

    static func source(_ server: BLIPSourceTests.Server) throws -> BLIPChangeSource {
        // What `pubsub relay blip --route …` gives the source: routes need the documents.
        let settings = FeedSettings(
            [
                "sg_url": .string("ws://127.0.0.1:\(server.port)/db"), "batch": 3,
                "route": .array(routes.map { .string($0.description) }),
            ], context: "feeds[0]")
        var configuration = try BLIPChangeSource.Configuration(settings: settings)
        configuration.reconnectDelay = .milliseconds(20)
        return BLIPChangeSource(configuration: configuration, logger: RoutedRelay.quiet)
    }

    @Test func routesAskForTheRevisionBodiesWithoutIncludeDoc() throws {
        let routed = try BLIPChangeSource.Configuration(
            settings: FeedSettings(
                ["sg_url": "ws://sg:4984/db", "route": ["db=/users/{doc.owner}/notes"]],
                context: "feeds[0]"))
        #expect(routed.includeDocuments)
        let plain = try BLIPChangeSource.Configuration(
            settings: FeedSettings(["sg_url": "ws://sg:4984/db"], context: "feeds[0]"))
        #expect(!plain.includeDocuments)
    }

    @Test func eachDocumentReachesItsAudienceAcrossAMoveARestartAndATombstone() async throws {
        let server = try await BLIPSourceTests.Server.start()
        defer { Task { await server.stop() } }
        let fake = server.fake
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        var relay = RoutedRelay.start(
            try Self.source(server), routes: Self.routes, publisher: publisher,
            directory: directory)
        fake.put("n1", body: ["owner": "a", "body": "1"])
        try await RoutedRelay.waitFor(1, publisher, "the insert")
        fake.put("n1", body: ["owner": "a", "body": "2"])
        try await RoutedRelay.waitFor(2, publisher, "the update")
        fake.put("n1", body: ["owner": "b", "body": "3"])
        try await RoutedRelay.waitFor(4, publisher, "the move")
        fake.put("s1", body: ["owner": "b", "members": ["a", "b"]])
        try await RoutedRelay.waitFor(7, publisher, "the shared document")
        try await relay.stop(directory: directory, publisher: publisher)
        // A new relay process: what it remembers of n1 (owner b) comes from <checkpoint>.audience. Sync Gateway's
        // tombstone has no fields.
        relay = RoutedRelay.start(
            try Self.source(server), routes: Self.routes, publisher: publisher, directory: directory)
        fake.put("n1", deleted: true, body: [:])
        try await RoutedRelay.waitFor(8, publisher, "the delete")
        try await relay.stop(directory: directory, publisher: publisher)
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
        #expect(fake.revsSent == 5, "one rev message per entry, the tombstone's too")
        #expect(fake.protocolErrors == [])
    }

    /// A tombstone goes where the document was by the remembered values first, else by its own fields (a document
    /// deleted with a body keeps them), else nowhere (`no_previous`).
    @Test func aTombstoneGoesByTheRememberedValuesElseByItsOwnFields() async throws {
        let server = try await BLIPSourceTests.Server.start()
        defer { Task { await server.stop() } }
        let fake = server.fake
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        // Before the relay ever ran: it sees only the tombstones.
        fake.put("kept", body: ["owner": "c"])
        fake.put("kept", deleted: true, body: ["owner": "c"])
        fake.put("bare", body: ["owner": "c"])
        fake.put("bare", deleted: true)
        fake.put("marker", body: ["owner": "m"])
        let relay = RoutedRelay.start(
            try Self.source(server), routes: Self.routes, publisher: publisher,
            directory: directory)
        try await RoutedRelay.waitFor(2, publisher, "the first sync")
        fake.put("moved", body: ["owner": "a"])
        try await RoutedRelay.waitFor(3, publisher, "the insert")
        fake.put("moved", deleted: true, body: ["owner": "z"])
        try await RoutedRelay.waitFor(4, publisher, "the delete")
        try await relay.stop(directory: directory, publisher: publisher)
        #expect(
            RoutedRelay.lines(publisher) == [
                "delete kept /users/c/notes",
                "insert marker /users/m/notes",
                "insert moved /users/a/notes",
                "delete moved /users/a/notes",
            ])
    }

    /// A revision Sync Gateway no longer has (`norev`, superseded meanwhile) is skipped rather than routed as a
    /// document without fields, which would have told its audience `left`; the later revision that follows moves
    /// it from the remembered owner.
    @Test func aRevisionSyncGatewayNoLongerHasIsSkippedNotRoutedAsEmpty() async throws {
        let server = try await BLIPSourceTests.Server.start()
        defer { Task { await server.stop() } }
        let fake = server.fake
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        let relay = RoutedRelay.start(
            try Self.source(server), routes: Self.routes, publisher: publisher,
            directory: directory)
        fake.put("n1", body: ["owner": "a"])
        try await RoutedRelay.waitFor(1, publisher, "the insert")
        let skipped = fake.put("n1", body: ["owner": "b"], bodyLost: true)
        try await BLIPSourceTests.eventually("the norev") { fake.norevsSent == 1 }
        try await eventually("the skipped change checkpointed") {
            (try? FileCheckpointStore(path: directory + "/checkpoint").load())?.position == "\(skipped)"
        }
        fake.put("n1", body: ["owner": "b", "body": "again"])
        try await RoutedRelay.waitFor(3, publisher, "the next revision")
        try await relay.stop(directory: directory, publisher: publisher)
        #expect(
            RoutedRelay.lines(publisher) == [
                "insert n1 /users/a/notes", "update n1 /users/a/notes left", "update n1 /users/b/notes joined",
            ])
    }
}
