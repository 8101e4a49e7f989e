/// Every error of the relay: a `code` saying what kind of failure it is (what a caller decides on) and a one-line
/// `message` for people (what the CLI prints). New kinds are new codes, so callers that match on codes keep
/// compiling (as postgres-nio's `PSQLError`).
public struct RelayError: Error, Sendable, Hashable, CustomStringConvertible {
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Base: String, Sendable, Hashable {
            case configuration, invalidURL, checkpoint, publish, source, sourceFatal
            case feed, blipProtocol, simperiumProtocol, malformedWal2JSON
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// A missing or mistyped setting of a relay file or an unknown source; the message names the setting
        /// (`feeds[1].url: …`), so one line tells what to fix.
        public static let configuration = Code(.configuration)
        /// A source URL or DSN that cannot be used (`--db-url`, `--sg-url`, `--dsn`).
        public static let invalidURL = Code(.invalidURL)
        /// A checkpoint that cannot be read or written, or that belongs to another source.
        public static let checkpoint = Code(.checkpoint)
        /// The broker did not acknowledge every message of a batch.
        public static let publish = Code(.publish)
        /// A source cannot reach or read its server; the source reconnects after it.
        public static let source = Code(.source)
        /// A source failure that ends the relay (a refused token, a server that cannot be opened at start).
        public static let sourceFatal = Code(.sourceFatal)
        /// A CouchDB `_changes` feed that went wrong: a malformed row, an unexpected status, a dropped connection,
        /// no heartbeat. The source reconnects after it.
        public static let feed = Code(.feed)
        /// A BLIP protocol violation: the connection is closed and the source reconnects.
        public static let blipProtocol = Code(.blipProtocol)
        /// A malformed or unexpected message on a Simperium stream.
        public static let simperiumProtocol = Code(.simperiumProtocol)
        /// A wal2json row that cannot be read.
        public static let malformedWal2JSON = Code(.malformedWal2JSON)

        public var description: String { base.rawValue }
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// Whether the relay must stop instead of reconnecting.
    public var isFatal: Bool { code == .sourceFatal }

    /// The message as printed: a BLIP protocol error says it is one.
    public var description: String { code == .blipProtocol ? "BLIP: " + message : message }
}
