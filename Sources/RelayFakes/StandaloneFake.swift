/// A fake feed server that `relay-fake <name> [options]` runs on its own for the CLI suites. Each fake is built from
/// the protocol description of its feed (../shared/RELAY.md), not from our own client, so that a client bug shows
/// up as a failing test instead of being mirrored by the fake.
public protocol StandaloneFake {
    /// The name after `relay-fake` (`couchdb`, `blip`, `simperium`).
    static var name: String { get }
    /// Runs until SIGTERM or SIGINT. Once it listens, prints exactly one line `listening <port>` on stdout
    /// (and flushes), so a test can read the port; `--port 0` (the default) picks a free one.
    static func runStandalone(arguments: [String]) async throws
}
