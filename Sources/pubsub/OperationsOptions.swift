import ArgumentParser
import NIOCore
import PubSubServer

/// `pubsub serve` options for running in production: TLS, limits, metrics, drain.
struct OperationsOptions: ParsableArguments {
    @Option(help: "PEM certificate (chain) for HTTPS and WSS on the same port; SIGHUP reloads it (PUBSUB_TLS_CERT).")
    var tlsCert: String?
    @Option(help: "PEM private key of --tls-cert (PUBSUB_TLS_KEY).") var tlsKey: String?
    @Option(
        help:
            "Open connections at once; beyond it HTTP 503 with Retry-After; 0 is no limit. Default: the file descriptor limit less max(64, limit/20) (PUBSUB_MAX_CONNECTIONS)."
    )
    var maxConnections: Int?
    @Option(
        help: "HTTP publish messages per window from one client address; beyond it 429 (PUBSUB_PUBLISH_LIMIT_PER_IP).")
    var publishLimitPerIp: Int?
    @Option(
        help:
            "HTTP publish messages per window per publish token (Bearer or ext token) (PUBSUB_PUBLISH_LIMIT_PER_TOKEN)."
    )
    var publishLimitPerToken: Int?
    @Option(help: "Seconds of the publish limit window; the budget refills over it (PUBSUB_PUBLISH_LIMIT_WINDOW).")
    var publishLimitWindow: Double?
    @Flag(
        help:
            "Behind a reverse proxy: the per-IP limits (publishes, failed /api keys) use the last X-Forwarded-For address (PUBSUB_TRUST_FORWARDED_FOR=1)."
    )
    var trustForwardedFor = false
    @Option(help: "Serve /metrics, /healthz and /readyz on this port instead of the main one (PUBSUB_METRICS_PORT).")
    var metricsPort: Int?
    @Option(help: "Seconds a SIGTERM drain may take before connections are closed (PUBSUB_DRAIN_TIMEOUT).")
    var drainTimeout: Double?
    @Flag(
        help:
            "SO_REUSEPORT: several pubsub processes share the port, the kernel spreads connections; use with the Redis engine (PUBSUB_REUSE_PORT=1)."
    )
    var reusePort = false

    /// `--max-connections` or PUBSUB_MAX_CONNECTIONS when given; nil for the default derived from the descriptor
    /// limit at start (`Serve.descriptorBudget`).
    func explicitMaxConnections() throws -> Int? {
        guard let value = try Environment.pick(maxConnections, "PUBSUB_MAX_CONNECTIONS") else { return nil }
        guard value >= 0 else { throw ValidationError("--max-connections must not be negative") }
        return value
    }

    func resolve() throws -> OperationsConfiguration {
        var operations = OperationsConfiguration(systemd: true)
        let cert = try Environment.pick(tlsCert, "PUBSUB_TLS_CERT")
        let key = try Environment.pick(tlsKey, "PUBSUB_TLS_KEY")
        switch (cert, key) {
        case (let cert?, let key?): operations.tls = .init(certificatePath: cert, keyPath: key)
        case (nil, nil): break
        default: throw ValidationError("--tls-cert and --tls-key go together")
        }
        operations.maxConnections = try explicitMaxConnections() ?? 0
        operations.publishLimitPerIP = try Environment.pick(publishLimitPerIp, "PUBSUB_PUBLISH_LIMIT_PER_IP")
        operations.publishLimitPerToken = try Environment.pick(publishLimitPerToken, "PUBSUB_PUBLISH_LIMIT_PER_TOKEN")
        for (value, name) in [(operations.publishLimitPerIP, "per-ip"), (operations.publishLimitPerToken, "per-token")]
        {
            if let value, value <= 0 { throw ValidationError("--publish-limit-\(name) must be a positive number") }
        }
        func seconds(_ amount: TimeAmount) -> Double { Double(amount.nanoseconds) / 1e9 }
        let window =
            try Environment.pick(publishLimitWindow, "PUBSUB_PUBLISH_LIMIT_WINDOW") ?? seconds(operations.publishWindow)
        guard window > 0, window <= 86_400 else {
            throw ValidationError("--publish-limit-window must be above 0 and at most 86400 seconds")
        }
        operations.publishWindow = .nanoseconds(Int64(window * 1e9))
        operations.trustForwardedFor = Environment.isSet(trustForwardedFor, "PUBSUB_TRUST_FORWARDED_FOR")
        if let port = try Environment.pick(metricsPort, "PUBSUB_METRICS_PORT") {
            guard (0...65535).contains(port) else {
                throw ValidationError("--metrics-port must be between 0 and 65535")
            }
            operations.metricsPort = port
        }
        let drain = try Environment.pick(drainTimeout, "PUBSUB_DRAIN_TIMEOUT") ?? seconds(operations.drainTimeout)
        guard drain > 0, drain <= 3600 else {
            throw ValidationError("--drain-timeout must be above 0 and at most 3600 seconds")
        }
        operations.drainTimeout = .nanoseconds(Int64(drain * 1e9))
        operations.reusePort = Environment.isSet(reusePort, "PUBSUB_REUSE_PORT")
        return operations
    }
}
