import ArgumentParser
import Logging
import PubSubClient
import PubSubRelay
import UnixSignals

/// `pubsub relay run FILE`: several feeds from a configuration file, side by side, each restarted after an error.
struct RelayRun: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Relay several change feeds described in a JSON configuration file.",
        discussion: """
            The file: {"url": BROKER, "secret": S, "token": JWT, "feeds": [{"name", "source", "checkpoint", …}, …]}. \
            Each feed takes name, source (\(FeedKind.allCases.map(\.rawValue).joined(separator: ", "))), checkpoint \
            (its own file), route (one or an array of COLLECTION=/channel/{field}), prefix, include_doc, batch_size, poll_interval, and its source's settings: the long options of \
            `pubsub relay <source>` in snake_case (e.g. "dsn", "slot", "table": ["public.notes"]). Unknown settings \
            are refused. --url/--secret and PUBSUB_URL/PUBSUB_SECRET win over the file's url and secret.

            A feed that fails (its database unreachable, a refused publish) is logged at error level and restarted \
            after a pause that doubles up to 30 s; the other feeds go on. The same file runs inside the broker with \
            `pubsub serve --relay FILE`, publishing in-process.

            Exit status:
              0   stopped by SIGINT or SIGTERM
              64  bad arguments or a bad configuration file
            """
    )

    @Argument(help: "The relay configuration file (JSON).")
    var file: String

    @Option(
        name: [.customLong("url"), .customLong("server")],
        help: "The broker's Bayeux endpoint (wins over the file's url, then PUBSUB_URL).")
    var url: String?

    @Option(help: "The broker's secret token (wins over the file's secret, then PUBSUB_SECRET).")
    var secret: String?

    @Option(help: "A JWT to publish with, sent as ext.token (wins over the file's token, then PUBSUB_TOKEN).")
    var token: String?

    @Option(
        help:
            "A PEM file of certificate authorities to trust for an https:// broker instead of the system's (PUBSUB_CA_FILE)."
    )
    var caFile: String?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical (PUBSUB_LOG_LEVEL).")
    var logLevel: Logger.Level?

    @Flag(help: "Only check the file: print one line per feed and exit 0, or the first problem and exit 64.")
    var check = false

    func validate() throws {
        _ = try RelayLogging.level(logLevel)
    }

    func run() async throws {
        let signalSequence = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        let logger = RelayLogging.bootstrap(try RelayLogging.level(logLevel))
        let relayFile: RelayFile
        do {
            relayFile = try RelayFile(path: file, logger: logger)
        } catch let error as RelayError where error.code == .configuration {
            throw failure(error.message, ExitStatus.usage)
        }
        if check {
            for feed in relayFile.feeds {
                print("\(feed.name): \(feed.kind.rawValue) → \(feed.mapping.prefix)/…, checkpoint \(feed.checkpoint)")
            }
            return
        }
        let url = self.url ?? relayFile.url ?? Environment.string("PUBSUB_URL") ?? ClientOptions.defaultURL
        let secret = self.secret ?? relayFile.secret ?? Environment.string("PUBSUB_SECRET")
        let token = self.token ?? relayFile.token ?? Environment.string("PUBSUB_TOKEN")
        var clients: [BayeuxClient] = []
        var runners: [FeedRunner] = []
        for feed in relayFile.feeds {
            let client: BayeuxClient
            var configuration = BayeuxClient.Configuration(transport: .longPolling, batchSize: feed.batchSize)
            configuration.trustRoots = caFile ?? Environment.string("PUBSUB_CA_FILE")
            do {
                client = try BayeuxClient(url: url, configuration: configuration)
            } catch let error as BayeuxClientError {
                throw failure(error)
            }
            clients.append(client)
            runners.append(
                FeedRunner(
                    feed: feed, publisher: BayeuxPublisher(client: client, secret: secret, token: token), logger: logger
                ))
        }
        logger.info("relaying \(runners.count) feed(s) to \(url)")
        let task = Task { await FeedRunner.runAll(runners) }
        let signals = Task {
            for await _ in signalSequence {
                task.cancel()
                return
            }
        }
        await task.value
        signals.cancel()
        for client in clients { await client.close() }
    }
}

enum RelayLogging {
    /// The level of the flag, else PUBSUB_LOG_LEVEL, else info; a variable that names no level is a usage error.
    static func level(_ flag: Logger.Level?) throws -> Logger.Level {
        try Environment.pick(flag, "PUBSUB_LOG_LEVEL", .info)
    }

    /// Logging to stderr at `level`.
    static func bootstrap(_ level: Logger.Level) -> Logger {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        return Logger(label: "pubsub.relay")
    }
}
