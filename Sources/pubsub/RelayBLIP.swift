import ArgumentParser
import NIOCore
import PubSubRelay

struct RelayBLIP: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blip",
        abstract: "Relay Couchbase Sync Gateway's replication feed (BLIP subChanges) to channel events.",
        discussion: """
            Opens a WebSocket to <sg-url>/_blipsync (subprotocol BLIP_3+CBMobile_3), subscribes with subChanges \
            (continuous, from the checkpointed since) and publishes every entry of the changes messages to \
            <prefix>/<db>/<escaped doc id>. Each changes message is answered only after its entries were \
            acknowledged by the broker and the checkpoint was written durably, so Sync Gateway never runs ahead of \
            the relay. After a crash or a dropped connection it resumes from its checkpoint: delivery is at least \
            once, and a change delivered twice carries the same data.key. When Sync Gateway refuses the \
            checkpointed since, the relay logs an error, counts it in pubsub_relay_resyncs_total and starts over \
            from since=0 (those events carry data.resync = true).

            data holds id (the document id), op (insert for a revision 1-…, update, delete for a tombstone), seq \
            (the Sync Gateway sequence as JSON), rev, key (the idempotency key), collection, source, and with \
            --include-doc doc (the revision's body, asked for with rev messages).

            Exit status:
              0   stopped by SIGINT or SIGTERM
              64  bad arguments
              69  the relay stopped on an error
            """
    )

    // A string, parsed in validate(): a value the parser refuses is echoed, and this one may carry a password.
    @Option(help: "The Sync Gateway database: ws[s]://[user:password@]host:4984/db.")
    var sgUrl: String

    @Option(help: "The Sync Gateway user (Basic authentication; overrides the URL's).")
    var user: String?

    @Option(help: "The user's password (overrides the URL's).")
    var password: String?

    @Option(help: "Relay only this Sync Gateway channel; repeat for several (default: every channel the user sees).")
    var channel: [String] = []

    @Option(help: "Entries per changes message asked of Sync Gateway (subChanges batch).")
    var batch: Int = 200

    @Flag(help: "Leave out deleted documents (subChanges activeOnly).")
    var activeOnly = false

    @OptionGroup var relay: RelayOptions

    @OptionGroup var jwt: JWTOptions

    @OptionGroup var feedTLS: FeedTLSOptions

    func validate() throws {
        do {
            _ = try BLIPURL(sgUrl)
        } catch let error as RelayError where error.code == .invalidURL {
            throw ValidationError("--sg-url \(error.message)")
        }
        guard batch > 0 else { throw ValidationError("--batch must be positive") }
        for name in channel where name.isEmpty || name.contains(",") {
            throw ValidationError("--channel must be a non-empty channel name without commas")
        }
    }

    func run() async throws {
        let tls = try feedTLS.make()
        let logger = try relay.makeLogger()
        let url = try BLIPURL(sgUrl, username: user, password: password)
        var configuration = BLIPChangeSource.Configuration(
            url: url, channels: channel, batch: batch,
            activeOnly: activeOnly, includeDocuments: relay.needsDocuments)
        configuration.tls = tls
        let source = BLIPChangeSource(configuration: configuration, logger: logger)
        try await relay.run(source: source, logger: logger, token: jwt.token)
    }
}
