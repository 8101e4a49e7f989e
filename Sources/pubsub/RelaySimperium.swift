import ArgumentParser
import NIOCore
import PubSubRelay

struct RelaySimperium: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simperium",
        abstract: "Relay a Simperium bucket's change stream to channel events.",
        discussion: """
            Opens the bucket over the streaming API (init with the token), resumes after the checkpointed \
            change version (cv), and publishes every change to <prefix>/<bucket>/<escaped id>. Without a \
            checkpoint, or when the server no longer knows the checkpointed cv (cv:?), it pages through the \
            full index and publishes every entity as an update with resync: true (the latter logged at error \
            level and counted in pubsub_relay_resyncs_total). Sends h:<n> heartbeats when the stream is quiet \
            and reconnects after the last change read when they go unanswered or the connection drops.

            data holds id, op (insert, update, delete), seq (the cv), rev (the entity version), key (the \
            idempotency key), collection (the bucket), source, resync for index entries, and with --include-doc \
            the entity as doc (fetched with e:<id>.<v>; absent when that version is already gone).

            Exit status:
              0   stopped by SIGINT or SIGTERM
              64  bad arguments
              69  the token was refused, the server cannot be reached, or the relay stopped on an error
            """
    )

    @Option(help: "The Simperium app id.")
    var appID: String

    @Option(help: "The access token (or SIMPERIUM_TOKEN).")
    var token: String?

    @Option(help: "The bucket to relay.")
    var bucket: String

    @Option(
        help: "The streaming API: a base URL (wss://api.simperium.com) or the full WebSocket URL.",
        transform: { try SimperiumURL($0) })
    var simperiumURL: SimperiumURL?

    @Option(help: "Seconds of quiet before a heartbeat is sent; an answer must come within half of it (at least 1 s).")
    var heartbeat: Double = 20

    @Option(help: "Entities per index page.")
    var indexPage: Int = 100

    @OptionGroup var relay: RelayOptions

    @OptionGroup var feedTLS: FeedTLSOptions

    func validate() throws {
        if let problem = SimperiumChangeSource.Configuration.problem(appID: appID, bucket: bucket) {
            throw ValidationError(problem)
        }
        guard resolvedToken != nil else { throw ValidationError("give --token or set SIMPERIUM_TOKEN") }
        guard heartbeat > 0, heartbeat <= 3600 else {
            throw ValidationError("--heartbeat must be in (0, 3600] seconds")
        }
        guard indexPage > 0, indexPage <= 1000 else { throw ValidationError("--index-page must be between 1 and 1000") }
    }

    var resolvedToken: String? {
        if let token, !token.isEmpty { return token }
        return SimperiumChangeSource.Configuration.environmentToken()
    }

    func run() async throws {
        let tls = try feedTLS.make()
        let logger = try relay.makeLogger()
        var configuration = SimperiumChangeSource.Configuration(
            url: SimperiumChangeSource.Configuration.websocketURL(base: simperiumURL?.text, appID: appID),
            appID: appID, token: resolvedToken ?? "", bucket: bucket, indexPageSize: indexPage,
            batchSize: relay.batchSize, includeDocuments: relay.needsDocuments,
            heartbeatInterval: .nanoseconds(Int64(heartbeat * 1e9)),
            heartbeatTimeout: .nanoseconds(Int64(max(heartbeat / 2, 1) * 1e9)))
        configuration.tls = tls
        let source = SimperiumChangeSource(configuration: configuration, logger: logger)
        try await relay.run(source: source, logger: logger)
    }
}

/// `--simperium-url`: a `ws://` or `wss://` URL, checked as the arguments are parsed.
struct SimperiumURL: Sendable {
    struct Invalid: Error, CustomStringConvertible {
        var description: String { "must be a ws:// or wss:// URL" }
    }

    let text: String

    init(_ text: String) throws {
        guard text.hasPrefix("ws://") || text.hasPrefix("wss://") else { throw Invalid() }
        self.text = text
    }
}
