import Bayeux
import Logging
import RelayFakes
import Testing

@testable import PubSubRelay

#if canImport(Glibc)
    import Glibc
#endif

/// `pubsub relay simperium --route`: with routes the source fetches every entity version (`e:<id>.<v>`) without
/// `--include-doc`; each change goes to its entity's audience only, across a move, a restart and a delete (which
/// carries no data: it goes by the remembered values); `{user}` is the user the token authenticated as.
@Suite(.serialized, .timeLimit(.minutes(1))) struct SimperiumRoutesTests {
    static let routes = [
        try! Route(parsing: "notes=/users/{doc.owner}/notes"),
        try! Route(parsing: "notes=/users/{doc.members[]}/shared"),
    ]

    static func source(port: Int, token: String = "secret-token", routes: [Route] = routes) throws
        -> SimperiumChangeSource
    {
        // What `pubsub relay simperium --route …` gives the source: routes need the documents.
        let settings = FeedSettings(
            [
                "app_id": "test-app", "token": .string(token), "bucket": "notes",
                "simperium_url": .string("ws://127.0.0.1:\(port)"),
                "route": .array(routes.map { .string($0.description) }),
            ], context: "feeds[0]")
        return SimperiumChangeSource(configuration: try .init(settings: settings), logger: RoutedRelay.quiet)
    }

    static func start(_ options: SimperiumFake.Options = .init()) async throws -> (SimperiumFake, Int) {
        let fake = SimperiumFake(options: options)
        let port = try await fake.start(logger: RoutedRelay.quiet)
        return (fake, port)
    }

    /// Waits until the checkpoint holds `position` (the end of the index, or the bucket's head).
    static func waitForCheckpoint(_ directory: String, _ position: String) async throws {
        try await eventually("the checkpoint at \(position)") {
            (try? FileCheckpointStore(path: directory + "/checkpoint").load())?.position == position
        }
    }

    @Test func routesFetchTheEntitiesWithoutIncludeDoc() throws {
        #expect(try Self.source(port: 1).configuration.includeDocuments)
        #expect(!(try Self.source(port: 1, routes: []).configuration.includeDocuments))
    }

    @Test func eachEntityReachesItsAudienceAcrossAMoveARestartAndADelete() async throws {
        let (fake, port) = try await Self.start()
        defer { Task { await fake.stop() } }
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        var relay = RoutedRelay.start(
            try Self.source(port: port), routes: Self.routes, publisher: publisher,
            directory: directory)
        try await Self.waitForCheckpoint(directory, fake.head(bucket: "notes"))  // the empty bucket indexed
        fake.put(bucket: "notes", id: "n1", data: ["owner": "a", "body": "1"])
        try await RoutedRelay.waitFor(1, publisher, "the insert")
        fake.put(bucket: "notes", id: "n1", data: ["owner": "a", "body": "2"])
        try await RoutedRelay.waitFor(2, publisher, "the update")
        fake.put(bucket: "notes", id: "n1", data: ["owner": "b", "body": "3"])
        try await RoutedRelay.waitFor(4, publisher, "the move")
        fake.put(bucket: "notes", id: "s1", data: ["owner": "b", "members": ["a", "b"]])
        try await RoutedRelay.waitFor(7, publisher, "the shared entity")
        try await relay.stop(directory: directory, publisher: publisher)
        // A new relay process: what it remembers of n1 (owner b) comes from <checkpoint>.audience.
        relay = RoutedRelay.start(
            try Self.source(port: port), routes: Self.routes, publisher: publisher,
            directory: directory)
        fake.delete(bucket: "notes", id: "n1")
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
    }

    /// `{user}`: every change of the bucket (the index, inserts, updates, deletes) goes to the token user's channel,
    /// the user escaped as one segment.
    @Test func theTokensUserRoutesEveryChangeOfTheBucket() async throws {
        let (fake, port) = try await Self.start(.init(tokens: ["t": "a@b.c"]))
        defer { Task { await fake.stop() } }
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        fake.put(bucket: "notes", id: "x1", data: ["text": "indexed"])
        let routes = [try Route(parsing: "notes=/users/{user}/notes")]
        let relay = RoutedRelay.start(
            try Self.source(port: port, token: "t", routes: routes), routes: routes,
            publisher: publisher, directory: directory)
        try await RoutedRelay.waitFor(1, publisher, "the index")
        fake.put(bucket: "notes", id: "x2", data: ["text": "new"])
        fake.put(bucket: "notes", id: "x2", data: ["text": "changed"])
        fake.delete(bucket: "notes", id: "x1")
        fake.delete(bucket: "notes", id: "x2")
        try await RoutedRelay.waitFor(5, publisher, "the live changes")
        try await relay.stop(directory: directory, publisher: publisher)
        #expect(
            RoutedRelay.lines(publisher) == [
                "update x1 /users/a@b$2Ec/notes",
                "insert x2 /users/a@b$2Ec/notes",
                "update x2 /users/a@b$2Ec/notes",
                "delete x1 /users/a@b$2Ec/notes",
                "delete x2 /users/a@b$2Ec/notes",
            ])
    }

    /// A version the server no longer has (`e:…\n?`: the entity changed again since) is skipped rather than routed
    /// as an entity without fields, which would have told its audience `left`; the later version moves it from the
    /// remembered owner.
    @Test func aVersionTheServerNoLongerHasIsSkippedNotRoutedAsEmpty() async throws {
        let (fake, port) = try await Self.start()
        defer { Task { await fake.stop() } }
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let publisher = FakePublisher(journal: Journal())
        var relay = RoutedRelay.start(
            try Self.source(port: port), routes: Self.routes, publisher: publisher,
            directory: directory)
        try await Self.waitForCheckpoint(directory, fake.head(bucket: "notes"))
        fake.put(bucket: "notes", id: "n1", data: ["owner": "a"])
        try await RoutedRelay.waitFor(1, publisher, "the insert")
        try await relay.stop(directory: directory, publisher: publisher)
        // While the relay is down: two versions; the first is gone by the time the relay asks for it.
        fake.put(bucket: "notes", id: "n1", data: ["owner": "b"])
        fake.put(bucket: "notes", id: "n1", data: ["owner": "b", "body": "again"])
        fake.forgetVersionHistory()
        relay = RoutedRelay.start(
            try Self.source(port: port), routes: Self.routes, publisher: publisher,
            directory: directory)
        try await RoutedRelay.waitFor(3, publisher, "the catch-up")
        try await Self.waitForCheckpoint(directory, fake.head(bucket: "notes"))
        try await relay.stop(directory: directory, publisher: publisher)
        #expect(
            RoutedRelay.lines(publisher) == [
                "insert n1 /users/a/notes", "update n1 /users/a/notes left", "update n1 /users/b/notes joined",
            ])
    }
}
