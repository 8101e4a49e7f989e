import ArgumentParser
import NIOCore
import PubSubRelay

struct RelayCouchDB: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "couchdb",
        abstract:
            "Relay a CouchDB-style _changes feed (CouchDB, Cloudant, PouchDB Server, Sync Gateway) to channel events.",
        discussion: """
            Follows <db-url>/_changes (feed=continuous by default, or longpoll or eventsource) with a heartbeat, \
            publishes every change to <prefix>/<db>/<escaped id> (a Sync Gateway keyspace db.scope.collection \
            gives <prefix>/<db>/<scope>/<collection>/<escaped id>), waits for the broker's acknowledgement and \
            writes the checkpoint (the seq) durably. After a crash it resumes with since=<checkpoint>: \
            delivery is at least once, and a change delivered twice carries the same data.key. A connection \
            that drops or stays silent for twice the heartbeat is reopened after the last change read. A since \
            the server no longer knows (HTTP 400) starts a full resync from since=0, logged at error level and \
            counted in pubsub_relay_resyncs_total; its events carry data.resync = true. The snapshot is read in \
            pages of --max-batch rows (feed=normal&limit=N), checkpointed at the rows' own seqs, so a relay \
            stopped mid-resync resumes from where it was; the feed is followed again after the last page.

            data holds id, op (insert for revision 1-…, update, delete for deleted rows and for Sync Gateway's \
            removed), rev, seq (the server's seq: an integer as written, a string seq such as 5-g1AAAA… or 12::34 as it is), key (the idempotency key), collection, source, \
            removed (the channels a document left, Sync Gateway), and doc with --include-doc.

            Exit status:
              0   stopped by SIGINT or SIGTERM
              64  bad arguments
              69  the database cannot be reached, refuses the credentials or does not exist, or the relay \
            stopped on an error
            """
    )

    // A string, parsed in validate(): a value the parser refuses is echoed, and this one may carry a password.
    @Option(
        name: .customLong("db-url"),
        help: "The database: http[s]://[user:password@]host[:port]/db (Sync Gateway: /db or /db.scope.collection).")
    var dbURL: String

    @Option(help: "continuous, longpoll or eventsource (CouchDB only).")
    var feed: CouchDBChangeSource.Feed = .continuous

    @Option(
        help:
            "Milliseconds between the server's heartbeats; no byte for twice as long reopens the feed (Sync Gateway needs at least 25000)."
    )
    var heartbeat: Int = 10000

    @Option(help: "A filter passed to the server (ddoc/name, _design, sync_gateway/bychannel).")
    var filter: String?

    @Option(help: "A Sync Gateway channel to follow (filter sync_gateway/bychannel); repeat for several.")
    var channel: [String] = []

    @Option(help: "Where to start without a checkpoint: 0 (everything) or now.")
    var since: String = "0"

    @Option(help: "Most changes per batch handed to the relay, and rows per page of a full resync.")
    var maxBatch: Int = 500

    @OptionGroup var relay: RelayOptions

    @OptionGroup var jwt: JWTOptions

    @OptionGroup var feedTLS: FeedTLSOptions

    func validate() throws {
        do {
            _ = try CouchDBURL(dbURL)
        } catch let error as RelayError where error.code == .invalidURL {
            throw ValidationError(error.message)
        }
        guard heartbeat > 0 else { throw ValidationError("--heartbeat must be positive (milliseconds)") }
        guard since == "0" || since == "now" else { throw ValidationError("--since must be 0 or now") }
        guard maxBatch > 0 else { throw ValidationError("--max-batch must be positive") }
        if let filter, filter.isEmpty { throw ValidationError("--filter must not be empty") }
        if channel.contains(where: { $0.isEmpty || $0.contains(",") }) {
            throw ValidationError("--channel must be a non-empty channel name without commas")
        }
    }

    func run() async throws {
        let tls = try feedTLS.make()
        let logger = try relay.makeLogger()
        var configuration = CouchDBChangeSource.Configuration(
            url: try CouchDBURL(dbURL), feed: feed,
            heartbeat: .milliseconds(Int64(heartbeat)), filter: filter, channels: channel,
            includeDocs: relay.needsDocuments, initialSince: since, maxBatch: maxBatch)
        configuration.tls = tls
        let source = CouchDBChangeSource(configuration: configuration, logger: logger)
        try await relay.run(source: source, logger: logger, token: jwt.token)
    }
}
