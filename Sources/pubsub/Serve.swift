import ArgumentParser
import CoreMetrics
import Logging
import NIOCore
import Prometheus
import PubSubCore
import PubSubRelay
import PubSubServer
import PubSubWebhooks
import ServiceLifecycle
import UnixSignals

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the broker.",
        discussion: """
            With no arguments: a broker on \(ServerConfiguration().host):\(ServerConfiguration().port) mounted at \(ServerConfiguration().mount) with the in-memory engine.
            Every option can also be set with an environment variable, PUBSUB_ and the option name in
            upper case with underscores (e.g. PUBSUB_PORT, PUBSUB_MAX_QUEUE); a flag wins over the variable.
            """
    )

    @Option(help: "Address to listen on (PUBSUB_HOST).") var host: String?
    @Option(help: "Port to listen on; 0 picks a free one (PUBSUB_PORT).") var port: Int?
    @Option(help: "Mount path (PUBSUB_MOUNT).") var mount: String?
    @Option(help: "Seconds a /meta/connect is held; sessions expire after twice this (PUBSUB_TIMEOUT).")
    var timeout: Double?
    @Option(help: "Seconds a client waits between connects, as advised (PUBSUB_INTERVAL).") var interval: Double?
    @Option(help: "Largest HTTP request body in bytes; larger gets 413 (PUBSUB_MAX_REQUEST_BYTES).")
    var maxRequestBytes: Int?
    @Option(help: "Largest WebSocket message in bytes; larger closes with 1009 (PUBSUB_MAX_FRAME_BYTES).")
    var maxFrameBytes: Int?
    @Option(
        help:
            "WebSocket compression (permessage-deflate), on or off: each event is compressed once per publish for the clients that negotiate it (PUBSUB_WEBSOCKET_COMPRESSION)."
    )
    var websocketCompression: Switch?
    @Option(help: "Events shorter than this many bytes go uncompressed (PUBSUB_WEBSOCKET_COMPRESSION_MIN_BYTES).")
    var websocketCompressionMinBytes: Int?
    @Option(help: "Events queued per client before it is dropped (PUBSUB_MAX_QUEUE).") var maxQueue: Int?
    @Option(
        help:
            "Bytes waiting to be written to one connection before it stops being read and its events queue (PUBSUB_MAX_OUTBOUND_BYTES)."
    )
    var maxOutboundBytes: Int?
    @Option(help: "Messages in one request or frame (PUBSUB_MAX_MESSAGES_PER_REQUEST).")
    var maxMessagesPerRequest: Int?
    @Option(help: "Subscriptions per client (PUBSUB_MAX_SUBSCRIPTIONS).") var maxSubscriptions: Int?
    @Option(help: "Longest channel name in bytes (PUBSUB_MAX_CHANNEL_LENGTH).") var maxChannelLength: Int?
    @Option(help: "Deepest JSON nesting accepted (PUBSUB_MAX_JSON_DEPTH).") var maxJsonDepth: Int?
    @Option(
        help:
            "Published messages kept for clients resuming after a reconnect; 0 turns history off (PUBSUB_HISTORY_SIZE)."
    )
    var historySize: Int?
    @Option(
        help: "Seconds a message stays in the history; 0 means until the size limit pushes it out (PUBSUB_HISTORY_TTL)."
    )
    var historyTtl: Double?
    @Option(
        help:
            "Bytes the history may hold (the stored events, summed); the oldest go first; 0: bounded by --history-size only (PUBSUB_HISTORY_BYTES)."
    )
    var historyBytes: Int?
    @Option(
        help:
            "Seconds a request head may take, from its first byte (from the connection's start for the first); then the connection is closed (PUBSUB_HEADER_TIMEOUT)."
    )
    var headerTimeout: Double?
    @Option(
        help:
            "Seconds a keep-alive connection may wait for its next request; a parked long-poll or an open stream is never idle (PUBSUB_IDLE_TIMEOUT)."
    )
    var idleTimeout: Double?
    @Option(
        help:
            "Seconds a connection's writes may stay blocked by a client that does not read before it is closed; its session survives (PUBSUB_SEND_TIMEOUT)."
    )
    var sendTimeout: Double?
    @Option(
        help:
            "Seconds of WebSocket silence before a ping; silent for twice this, the socket is closed (PUBSUB_PING_INTERVAL)."
    )
    var pingInterval: Double?
    @Option(
        help:
            "Key of the server API (/api) and the dashboard (/admin), sent as `Authorization: apikey KEY`; without it both are off (PUBSUB_API_KEY)."
    )
    var apiKey: String?
    @OptionGroup(title: "Authentication") var auth: AuthOptions
    @OptionGroup(title: "Production") var operations: OperationsOptions
    @OptionGroup(title: "Several nodes") var cluster: EngineOptions
    @OptionGroup(title: "Webhooks") var webhooks: WebhookOptions
    @Option(
        help:
            "A relay configuration file (see `pubsub relay run --help`): its change feeds are published in-process, and its metrics are on /metrics (PUBSUB_RELAY)."
    )
    var relay: String?
    @Option(help: "Event-loop threads; 0 is one per core (PUBSUB_THREADS).") var threads: Int?
    @Option(help: "trace, debug, info, notice, warning, error or critical (PUBSUB_LOG_LEVEL).")
    var logLevel: Logger.Level?

    func resolved() throws -> (ServerConfiguration, Logger.Level) {
        // Each default is written once, in the configuration types; a flag, then its variable, replace it.
        let defaults = ServerConfiguration()
        func seconds(_ amount: TimeAmount) -> Double { Double(amount.nanoseconds) / 1e9 }
        func positive(_ value: Int, _ name: String) throws -> Int {
            guard value > 0 else { throw ValidationError("--\(name) must be a positive number") }
            return value
        }
        let timeout = try Environment.pick(self.timeout, "PUBSUB_TIMEOUT", seconds(defaults.broker.timeout))
        let interval = try Environment.pick(self.interval, "PUBSUB_INTERVAL", seconds(defaults.broker.interval))
        let port = try Environment.pick(self.port, "PUBSUB_PORT", defaults.port)
        guard (0...65535).contains(port) else { throw ValidationError("--port must be between 0 and 65535") }
        guard timeout > 0, timeout <= 3600 else {
            throw ValidationError("--timeout must be above 0 and at most 3600 seconds")
        }
        guard interval >= 0 else { throw ValidationError("--interval must not be negative") }
        let historySize = try Environment.pick(self.historySize, "PUBSUB_HISTORY_SIZE", defaults.broker.historySize)
        guard historySize >= 0 else { throw ValidationError("--history-size must not be negative") }
        let historyTTL = try Environment.pick(
            self.historyTtl, "PUBSUB_HISTORY_TTL", defaults.broker.historyTTL.map(seconds) ?? 0)
        guard historyTTL >= 0 else { throw ValidationError("--history-ttl must not be negative") }
        let historyBytes = try Environment.pick(self.historyBytes, "PUBSUB_HISTORY_BYTES", defaults.broker.historyBytes)
        guard historyBytes >= 0 else { throw ValidationError("--history-bytes must not be negative") }
        let broker = BrokerConfiguration(
            timeout: .nanoseconds(Int64(timeout * 1e9)),
            interval: .nanoseconds(Int64(interval * 1e9)),
            maxQueue: try positive(
                Environment.pick(maxQueue, "PUBSUB_MAX_QUEUE", defaults.broker.maxQueue), "max-queue"),
            maxSubscriptionsPerClient: try positive(
                Environment.pick(
                    maxSubscriptions, "PUBSUB_MAX_SUBSCRIPTIONS", defaults.broker.maxSubscriptionsPerClient),
                "max-subscriptions"),
            maxChannelLength: try positive(
                Environment.pick(maxChannelLength, "PUBSUB_MAX_CHANNEL_LENGTH", defaults.broker.maxChannelLength),
                "max-channel-length"),
            maxMessagesPerRequest: try positive(
                Environment.pick(
                    maxMessagesPerRequest, "PUBSUB_MAX_MESSAGES_PER_REQUEST", defaults.broker.maxMessagesPerRequest),
                "max-messages-per-request"),
            historySize: historySize,
            historyTTL: historyTTL > 0 ? .nanoseconds(Int64(historyTTL * 1e9)) : nil,
            historyBytes: historyBytes,
            eventCompression: try resolvedCompression(defaults.broker.eventCompression)
        )
        _ = try auth.resolve()
        let access = try auth.modes.resolve()
        let level = try Environment.pick(logLevel, "PUBSUB_LOG_LEVEL", .info)
        func duration(_ flag: Double?, _ env: String, _ fallback: TimeAmount, _ name: String) throws -> TimeAmount {
            let value = try Environment.pick(flag, env, seconds(fallback))
            guard value > 0, value <= 3600 else {
                throw ValidationError("--\(name) must be above 0 and at most 3600 seconds")
            }
            return .nanoseconds(Int64(value * 1e9))
        }
        var timeouts = defaults.timeouts
        timeouts.header = try duration(
            headerTimeout, "PUBSUB_HEADER_TIMEOUT", defaults.timeouts.header, "header-timeout")
        timeouts.idle = try duration(idleTimeout, "PUBSUB_IDLE_TIMEOUT", defaults.timeouts.idle, "idle-timeout")
        timeouts.send = try duration(sendTimeout, "PUBSUB_SEND_TIMEOUT", defaults.timeouts.send, "send-timeout")
        let pingInterval = try duration(
            self.pingInterval, "PUBSUB_PING_INTERVAL", defaults.pingInterval, "ping-interval")
        let maxDepth = try positive(
            Environment.pick(maxJsonDepth, "PUBSUB_MAX_JSON_DEPTH", defaults.maxJSONDepth), "max-json-depth")
        guard maxDepth <= 512 else { throw ValidationError("--max-json-depth must be at most 512") }
        let configuration = ServerConfiguration(
            host: try Environment.pick(host, "PUBSUB_HOST", defaults.host),
            port: port,
            mount: try Environment.pick(mount, "PUBSUB_MOUNT", defaults.mount),
            maxRequestBytes: try positive(
                Environment.pick(maxRequestBytes, "PUBSUB_MAX_REQUEST_BYTES", defaults.maxRequestBytes),
                "max-request-bytes"),
            maxFrameBytes: try positive(
                Environment.pick(maxFrameBytes, "PUBSUB_MAX_FRAME_BYTES", defaults.maxFrameBytes), "max-frame-bytes"),
            maxJSONDepth: maxDepth,
            maxOutboundBytes: try positive(
                Environment.pick(maxOutboundBytes, "PUBSUB_MAX_OUTBOUND_BYTES", defaults.maxOutboundBytes),
                "max-outbound-bytes"),
            broker: broker,
            extensions: ExtensionPipeline(),
            threads: try Environment.pick(threads, "PUBSUB_THREADS", defaults.threads),
            operations: try operations.resolve(),
            timeouts: timeouts,
            pingInterval: pingInterval,
            apiKey: try resolvedAPIKey()
        )
        var withAccess = configuration
        withAccess.origins = access.origins
        withAccess.callbackPolling = access.callbackPolling
        return (withAccess, level)
    }

    /// `--websocket-compression` and its minimum size; nil when off.
    func resolvedCompression(_ fallback: EventCompression?) throws -> EventCompression? {
        let compression = try Environment.pick(
            websocketCompression, "PUBSUB_WEBSOCKET_COMPRESSION", fallback == nil ? .off : .on)
        guard compression.isOn else { return nil }
        let bytes = try Environment.pick(
            websocketCompressionMinBytes, "PUBSUB_WEBSOCKET_COMPRESSION_MIN_BYTES",
            fallback?.minimumBytes ?? EventCompression.defaultMinimumBytes)
        guard bytes >= 0 else {
            throw ValidationError("--websocket-compression-min-bytes must be a number of bytes, 0 or more")
        }
        return EventCompression(minimumBytes: bytes)
    }

    /// `--api-key`, then PUBSUB_API_KEY; a key shorter than 16 bytes is refused (it guards kicking clients).
    func resolvedAPIKey() throws -> String? {
        guard let key = try Environment.pick(apiKey, "PUBSUB_API_KEY") else { return nil }
        guard key.utf8.count >= 16, !key.contains(where: { $0 == " " || $0.isNewline }) else {
            throw ValidationError("--api-key must be at least 16 characters, without spaces")
        }
        return key
    }

    func run() async throws {
        // Trapped first: a SIGTERM that comes while the broker is still starting (systemd stopping it at once,
        // say) is kept and drains it as soon as it runs, instead of killing it with the default action.
        let signals = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        // Likewise a SIGHUP (a renewal hook that runs as soon as the port answers) is kept for the reloader, not
        // taken with the default action, which ends the process.
        let reloads = await UnixSignalsSequence(trapping: .sighup)
        var (configuration, level) = try resolved()
        let registry = Self.bootstrap(level)
        let logger = Logger(label: "pubsub")
        // After the bootstraps: the hook's logger and counters are made with it.
        let authorization = try await auth.makeAuthorization()
        configuration.extensions.authorization = authorization.pipeline
        let relayFile = try loadRelayFile()
        let webhooks = try makeWebhooks()
        // After every flag and file was checked (a bad one is a single line on stderr), before the engine's and
        // the server's connections: the soft descriptor limit raised, and the connection limit it allows.
        configuration.operations.maxConnections = try descriptorBudget(logger: logger)
        // Said before the port opens: whoever can connect meets these rules, and a log read as soon as the port
        // answers has them.
        for sentence in authorization.summary { logger.info("auth: \(sentence)") }
        for warning in authorization.warnings { logger.warning("auth: \(warning)") }
        if configuration.extensions.authorization.isEmpty {
            logger.notice("no secret set: anyone may subscribe and publish (set --secret or PUBSUB_SECRET)")
        }
        let engine = try await cluster.makeEngine(configuration: configuration.broker, events: webhooks, logger: logger)
        let server = PubSubServer(
            configuration: configuration, logger: logger, metrics: .prometheus(registry), engine: engine)
        try await listen(server, configuration, logger: logger)
        // Before the server: the JWKS refresh and the webhooks stop after it has drained (the last sessions'
        // events still go); the relay after it, so that it shuts down first and no publish meets a draining broker.
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: CertificateReloader(server: server, signals: reloads, logger: logger))
        ]
        services.append(contentsOf: authorization.services.map { .init(service: $0) })
        if let webhooks {
            services.append(.init(service: webhooks))
            logger.info(
                "webhooks: \(webhooks.configuration.urls.count) URL(s), events \(webhooks.configuration.events.map(\.rawValue).sorted().joined(separator: ","))"
            )
        }
        services.append(.init(service: server))
        if let relayFile {
            services.append(.init(service: try relayService(relayFile, server: server, logger: logger)))
        }
        // SIGTERM or SIGINT: a graceful drain (services stop in reverse order: the relay, then the server).
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: services, logger: logger))
        let drainOnSignal = Task {
            for await _ in signals {
                await group.triggerGracefulShutdown()
                return
            }
        }
        defer { drainOnSignal.cancel() }
        try await group.run()
    }

    /// Logs to stderr at `level`; one registry for /metrics: the broker's own metrics and whatever uses
    /// swift-metrics in this process.
    private static func bootstrap(_ level: Logger.Level) -> PrometheusCollectorRegistry {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        return registry
    }

    /// `--relay`'s file, read and checked; a bad one is one line on stderr and the usage exit status.
    private func loadRelayFile() throws -> RelayFile? {
        guard let path = try Environment.pick(relay, "PUBSUB_RELAY") else { return nil }
        do {
            return try RelayFile(path: path, logger: Logger(label: "pubsub.relay"))
        } catch let error as RelayError where error.code == .configuration {
            printError("pubsub: \(error.message)")
            throw ExitCode(ExitStatus.usage)
        }
    }

    /// The webhook dispatcher, when webhooks are configured; bad settings are one line and the usage status.
    private func makeWebhooks() throws -> WebhookDispatcher? {
        do {
            return try webhooks.resolve().map {
                WebhookDispatcher(configuration: $0, logger: Logger(label: "pubsub.webhooks"))
            }
        } catch let error as ValidationError {
            printError("pubsub: \(error.message)")
            throw ExitCode(ExitStatus.usage)
        }
    }

    /// Opens the port (and says where); what stops it is one line on stderr and a failure exit status.
    private func listen(_ server: PubSubServer, _ configuration: ServerConfiguration, logger: Logger) async throws {
        let port: Int
        do {
            port = try await server.start()
        } catch let error as TLSFileError {
            printError("pubsub: \(error)")
            throw ExitCode.failure
        } catch let error as IOError where error.errnoCode == EADDRINUSE {
            let hint =
                configuration.operations.reusePort
                ? "another process holds it without --reuse-port"
                : "another process holds it (several pubsub processes share one port with --reuse-port)"
            printError("pubsub: cannot listen on \(configuration.host):\(configuration.port): address in use: \(hint)")
            throw ExitCode.failure
        } catch {
            printError("pubsub: cannot listen on \(configuration.host):\(configuration.port): \(error)")
            throw ExitCode.failure
        }
        let scheme = configuration.operations.tls == nil ? "http" : "https"
        logger.info("listening on \(scheme)://\(configuration.host):\(port)\(configuration.mount)")
    }

    /// The feeds of `--relay`, published in-process.
    private func relayService(_ relayFile: RelayFile, server: PubSubServer, logger: Logger) throws -> RelayService {
        let token = try auth.secretToken()
        let jwt = relayFile.token ?? Environment.string("PUBSUB_TOKEN")
        let health = RelayHealth()
        server.addReadinessNotes { health.lines }
        let runners = relayFile.feeds.map { feed in
            FeedRunner(
                feed: feed,
                publisher: MessagePublisher(token: token, jwt: jwt, batchSize: feed.batchSize) { messages in
                    try await server.publishInProcess(messages)
                },
                health: health, logger: Logger(label: "pubsub.relay"))
        }
        logger.info("relaying \(runners.count) feed(s) in-process")
        return RelayService(runners: runners)
    }
}

/// The relay feeds of `serve --relay`, stopped (cancelled) when the broker begins to drain.
struct RelayService: Service {
    let runners: [FeedRunner]

    func run() async {
        await cancelWhenGracefulShutdown {
            await FeedRunner.runAll(runners)
        }
    }
}

func printError(_ line: String) {
    let text = line + "\n"
    _ = text.utf8.withContiguousStorageIfAvailable { write(2, $0.baseAddress, $0.count) }
}
