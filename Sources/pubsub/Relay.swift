import ArgumentParser
import Bayeux
import Logging
import NIOCore
import PubSubClient
import PubSubRelay
import UnixSignals

/// `pubsub relay <source> …`: replication change feeds become channel events.
struct RelayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "relay",
        abstract: "Publish a database's replication change feed as channel events, resuming exactly after a crash.",
        subcommands: [RelayPostgres.self, RelayCouchDB.self, RelayBLIP.self, RelaySimperium.self, RelayRun.self]
    )
}

/// Options every relay source shares: the broker, the checkpoint, the channel mapping.
struct RelayOptions: ParsableArguments {
    @OptionGroup var client: ClientOptions

    @Option(help: "The checkpoint file: the last position relayed, written durably after the broker's acknowledgement.")
    var checkpoint: String

    @Option(help: "The channel prefix: changes go to <prefix>/<collection…>/<escaped id>.")
    var prefix: String = "/changes"

    @Flag(help: "Put the row or document in data.doc.")
    var includeDoc = false

    @Option(
        help: ArgumentHelp(
            "Send a collection's changes to the channels of their audience instead: COLLECTION=/channel/{field}, e.g. 'public.notes=/users/{owner_id}/notes'; repeat for several (docs/RELAY.md, routing).",
            valueName: "route"))
    var route: [String] = []

    @Option(
        help:
            "With --route over CouchDB, Sync Gateway or Simperium: how many documents' routed values are remembered (in <checkpoint>.audience) to route their deletes and moves."
    )
    var routeMemory: Int = 100_000

    /// Whether the source must read documents: for data.doc, or because routes read them.
    var needsDocuments: Bool { includeDoc || !route.isEmpty }

    @Option(
        help:
            "A JWT the relay publishes with, sent as ext.token on each publish, for a broker with --jwt-key or --jwt-public-key (PUBSUB_TOKEN; pubsub relay postgres, couchdb and blip also take it as --token)."
    )
    var brokerToken: String?

    @Option(help: "Messages per publish request.")
    var batchSize: Int = 100

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical (PUBSUB_LOG_LEVEL).")
    var logLevel: Logger.Level?

    func validate() throws {
        guard ChangeMapping.isValidPrefix(prefix) else {
            throw ValidationError("--prefix must be a channel name outside /meta and /service, e.g. /changes")
        }
        guard !checkpoint.isEmpty else { throw ValidationError("--checkpoint must name a file") }
        guard batchSize > 0 else { throw ValidationError("--batch-size must be positive") }
        guard routeMemory > 0 else { throw ValidationError("--route-memory must be positive") }
        _ = try routes()
        _ = try RelayLogging.level(logLevel)
    }

    /// The `--route` options, parsed; a bad one is a usage error naming it.
    func routes() throws -> [Route] {
        do {
            return try route.map { text throws(RelayError) in try Route(parsing: text) }
        } catch {
            throw ValidationError("--" + error.message)
        }
    }

    var mapping: ChangeMapping {
        get throws { ChangeMapping(prefix: prefix, includeDocument: includeDoc, routes: try routes()) }
    }

    func makeLogger() throws -> Logger {
        RelayLogging.bootstrap(try RelayLogging.level(logLevel))
    }

    func makePublisher(token: String?) throws -> BayeuxPublisher {
        let (url, secret) = try client.resolve()
        var configuration = BayeuxClient.Configuration(transport: .longPolling, batchSize: batchSize)
        configuration.trustRoots = client.trustRoots
        do {
            return BayeuxPublisher(
                client: try BayeuxClient(url: url, configuration: configuration), secret: secret,
                token: token ?? brokerToken ?? Environment.string("PUBSUB_TOKEN"))
        } catch let error as BayeuxClientError {
            throw failure(error)
        }
    }

    /// Runs the relay until SIGINT/SIGTERM; a fatal error prints one line and exits non-zero (64 for a
    /// configuration the database refuses, such as a routed table whose replica identity lacks a routed column).
    func run(source: any ChangeSource, logger: Logger, token: String? = nil) async throws {
        let signalSequence = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        let publisher = try makePublisher(token: token)
        let relay = Relay(
            source: source, publisher: publisher, store: FileCheckpointStore(path: checkpoint),
            configuration: .init(
                mapping: try mapping, audiencePath: checkpoint + ".audience", rememberedDocuments: routeMemory),
            logger: logger)
        let task = Task { try await relay.run() }
        let signals = Task {
            for await _ in signalSequence {
                task.cancel()
                return
            }
        }
        let result = await task.result
        _ = signals
        await source.close()
        await publisher.client.close()
        switch result {
        case .success:
            return
        case .failure(is CancellationError):
            return
        case .failure(let error as RelayError) where error.code == .configuration:
            throw failure("relay stopped: \(error.message)", ExitStatus.usage)
        case .failure(let error):
            throw failure("relay stopped: \(source.describe(error))", ExitStatus.unavailable)
        }
    }
}

struct RelayPostgres: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "postgres",
        abstract: "Relay PostgreSQL logical decoding (pgoutput, or wal2json) to channel events.",
        discussion: """
            Streams the slot over PostgreSQL's replication protocol with the built-in pgoutput plugin (no \
            extension on the server), through a publication of the given tables (pubsub_<slot>, created if \
            missing, or --publication), and publishes every insert, update, delete and truncate of them to \
            <prefix>/<schema>/<table>/<escaped id>. It waits for the broker's acknowledgement, writes the \
            checkpoint durably, and only then confirms the position to the slot. After a crash it resumes from its \
            checkpoint: delivery is at least once, and a change delivered twice carries the same data.key. Creates \
            the slot (plugin pgoutput) if it is missing. The server needs wal_level=logical; the role needs LOGIN \
            REPLICATION (and, for the publication it creates, ownership of the tables).

            --plugin wal2json reads an existing wal2json slot over an ordinary SQL connection instead \
            (pg_logical_slot_peek_changes, then pg_replication_slot_advance, polled every --poll-interval); \
            PostgreSQL 15.19 and later load wal2json only when output_plugin_libraries names it.

            data holds id (the primary key as text), op (insert, update, delete, truncate), seq (the source \
            position), key (the idempotency key), collection, source, txn, and doc with --include-doc.

            With --route 'public.notes=/users/{owner_id}/notes' a table's changes go to the channels of their \
            audience instead, each value escaped into one segment: an insert to the new row's, a delete to the old \
            row's, an update to the new row's, and when it moved a row, to the old row's with audience "left" (no \
            doc) and the new one's with audience "joined". A truncate goes to <prefix>/<schema>/<table>, for \
            operators. Routed tables need a replica identity that holds the routed columns (REPLICA IDENTITY \
            FULL): checked at start.

            Exit status:
              0   stopped by SIGINT or SIGTERM
              64  bad arguments, or a routed table whose replica identity lacks a routed column
              69  the database cannot be reached or refused, or the relay stopped on an error
            """
    )

    @Option(
        help:
            "The database: postgres://user[:password]@host[:port]/database[?sslmode=…&sslrootcert=ca.pem] (or ?host=/socket/dir); sslmode as libpq: disable, allow, prefer (default), require, verify-ca, verify-full."
    )
    var dsn: String

    @Option(help: "The logical replication slot (created with the plugin if missing).")
    var slot: String

    @Option(help: "The slot's logical decoding plugin: pgoutput (streamed; the default) or wal2json (polled).")
    var plugin: PostgresChangeSource.Plugin = .pgoutput

    @Option(
        help:
            "The publication pgoutput reads (it must exist and hold the tables); default pubsub_<slot>, created if missing."
    )
    var publication: String?

    @Option(help: "A table to relay, as schema.table; repeat for several.")
    var table: [String] = []

    @Option(
        help:
            "With wal2json: seconds of rest after a poll that found the slot drained (a full poll is followed by the next at once)."
    )
    var pollInterval: Double = 0.1

    @Option(help: "Most changes per batch; a larger transaction is relayed and checkpointed in pieces.")
    var maxChanges: Int = 5000

    @Option(
        help:
            "The slot lag (MB of WAL between the server's head and what the relay confirmed) above which the relay says it is behind (log, /readyz with serve --relay)."
    )
    var behindMb: Int = 64

    @OptionGroup var relay: RelayOptions

    @OptionGroup var jwt: JWTOptions

    func validate() throws {
        guard PostgresChangeSource.isValidSlotName(slot) else {
            throw ValidationError("--slot must be lower-case letters, digits and underscores (at most 63)")
        }
        guard !table.isEmpty else { throw ValidationError("name at least one --table schema.table") }
        for name in table {
            if let problem = PostgresChangeSource.tableNameProblem(name) { throw ValidationError("--table \(problem)") }
        }
        guard pollInterval > 0, pollInterval.isFinite else { throw ValidationError("--poll-interval must be positive") }
        if let publication, !PostgresChangeSource.isValidSlotName(publication) {
            throw ValidationError("--publication must be lower-case letters, digits and underscores (at most 63)")
        }
        guard maxChanges > 0 else { throw ValidationError("--max-changes must be positive") }
        guard (1...1_000_000).contains(behindMb) else { throw ValidationError("--behind-mb must be 1 to 1000000") }
        do {
            _ = try PostgresDSN(dsn)
        } catch {
            throw ValidationError(error.message)
        }
        _ = try configuration()
    }

    func configuration() throws -> PostgresChangeSource.Configuration {
        var configuration = PostgresChangeSource.Configuration(
            dsn: try PostgresDSN(dsn), slot: slot, tables: table, maxChangesPerPeek: maxChanges,
            pollInterval: .nanoseconds(Int64(pollInterval * 1e9)))
        configuration.plugin = plugin
        configuration.publication = publication
        configuration.behindBytes = UInt64(behindMb) << 20
        do {
            try configuration.route(try relay.routes())
        } catch let error as RelayError {
            throw ValidationError("--route " + error.message)
        }
        return configuration
    }

    func run() async throws {
        let logger = try relay.makeLogger()
        let source = PostgresChangeSource(configuration: try configuration(), logger: logger)
        try await relay.run(source: source, logger: logger, token: jwt.token)
    }
}

/// Publishes through the Bayeux client: pipelined bulk publish, one request carrying `batchSize` messages; done
/// only when the broker acknowledged every message.
struct BayeuxPublisher: Publisher {
    let client: BayeuxClient
    let secret: String?
    /// A JWT sent as `ext.token` with every publish.
    var token: String? = nil

    func publish(_ messages: [RelayMessage]) async throws {
        var ext: JSONObject? = secret.map { ["private_pub_token": .string($0)] }
        if let token {
            var withToken = ext ?? [:]
            withToken["token"] = .string(token)
            ext = withToken
        }
        let results = try await client.publish(
            messages.map {
                BayeuxClient.Publication(channel: $0.channel, data: $0.data, ext: ext)
            })
        if let index = results.firstIndex(where: { !$0.successful }) {
            let refused = results.filter { !$0.successful }.count
            throw RelayError(
                .publish,
                "the broker refused \(refused) of \(results.count) messages (first on \(messages[index].channel): \(results[index].error ?? "refused"))"
            )
        }
    }
}

extension PostgresChangeSource.Plugin: ExpressibleByArgument {}
