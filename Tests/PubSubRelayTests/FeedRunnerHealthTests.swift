import Bayeux
import Logging
import NIOConcurrencyHelpers
import Testing

@testable import PubSubRelay

/// A source the test steers: its start fails while `failures` lasts (with a configuration error when
/// `refusesConfiguration`), it says it is behind while `behind` is set, and it never has a batch.
final class SteeredSource: ChangeSource {
    let sourceID = "fake:steered"
    let failures = NIOLockedValueBox(0)
    let refusesConfiguration = NIOLockedValueBox(false)
    let behind = NIOLockedValueBox(false)
    let starts = NIOLockedValueBox(0)

    func start(after position: String?) async throws {
        starts.withLockedValue { $0 += 1 }
        if refusesConfiguration.withLockedValue({ $0 }) {
            throw RelayError(.configuration, "public.notes has replica identity nothing")
        }
        let fail = failures.withLockedValue { count -> Bool in
            defer { count = max(0, count - 1) }
            return count > 0
        }
        if fail { throw RelayError(.source, "connection refused") }
    }
    func next() async throws -> ChangeBatch? {
        try await Task.sleep(for: .seconds(3600))
        return nil
    }
    func confirm(_ position: String) async throws {}
    func lag() async -> SourceLag? { SourceLag(amount: 70_000_000, unit: "WAL bytes") }
    func isBehind() async -> Bool { behind.withLockedValue { $0 } }
    func close() async {}
}

@Suite(.timeLimit(.minutes(1))) struct FeedRunnerHealthTests {
    func runner(_ source: SteeredSource, health: RelayHealth, directory: String) throws -> FeedRunner {
        let file = try RelayFile(
            json: try JSONParser().parse(
                Array(
                    """
                    {"feeds": [{"name": "notes", "source": "postgres", "dsn": "postgres://u@h/db", "slot": "s",
                      "table": "public.notes", "checkpoint": "\(directory)/checkpoint"}]}
                    """.utf8)),
            logger: Logger(label: "test"))
        var runner = FeedRunner(
            feed: file.feeds[0], publisher: FakePublisher(journal: Journal()), health: health,
            logger: Logger(label: "test"))
        runner.healthInterval = .milliseconds(5)
        runner.makeSource = { _, _ in source }
        return runner
    }

    func waitFor(_ health: RelayHealth, _ line: String) async throws {
        let deadline = ContinuousClock.now + .seconds(20)
        while health.lines != [line] {
            guard ContinuousClock.now < deadline else {
                Issue.record("waited for \(line); have \(health.lines)")
                throw Injected()
            }
            try await Task.sleep(for: .milliseconds(2))
        }
    }

    @Test func aFeedSaysWhenItRestartsIsBehindAndCatchesUp() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let source = SteeredSource()
        source.failures.withLockedValue { $0 = 1 }
        let health = RelayHealth()
        let task = Task { [runner = try runner(source, health: health, directory: directory)] in await runner.run() }
        defer { task.cancel() }
        try await waitFor(health, "relay notes: restarting after an error: connection refused")
        // The runner starts it again after its pause.
        try await waitFor(health, "relay notes: relaying")
        #expect(source.starts.withLockedValue { $0 } == 2)
        source.behind.withLockedValue { $0 = true }
        try await waitFor(health, "relay notes: behind (70000000 WAL bytes)")
        source.behind.withLockedValue { $0 = false }
        try await waitFor(health, "relay notes: relaying")
        task.cancel()
        await task.value
    }

    @Test func aFeedTheDatabaseRefusesSaysItStopped() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let source = SteeredSource()
        source.refusesConfiguration.withLockedValue { $0 = true }
        let health = RelayHealth()
        // The runner returns by itself: no restart mends a refused configuration.
        try await runner(source, health: health, directory: directory).run()
        #expect(health.lines == ["relay notes: stopped: public.notes has replica identity nothing"])
        #expect(health.state(of: "notes") == .stopped("public.notes has replica identity nothing"))
        #expect(health.state(of: "other") == nil)
    }

    @Test func aFeedWhoseSourceCannotBeBuiltSaysItStopped() async throws {
        let directory = temporaryDirectory()
        defer { removeDirectory(directory) }
        let health = RelayHealth()
        var runner = try runner(SteeredSource(), health: health, directory: directory)
        runner.makeSource = { _, _ in throw RelayError(.configuration, "no such source") }
        await runner.run()
        #expect(health.lines == ["relay notes: stopped: cannot be built: no such source"])
    }
}
