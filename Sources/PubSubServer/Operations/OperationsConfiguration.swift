import NIOCore

/// How the server runs as a daemon: systemd, TLS, health and metrics, connection and publish limits, drain.
/// Every default is "off" or unlimited, so a server built with `ServerConfiguration()` behaves as before.
public struct OperationsConfiguration: Sendable {
    /// PEM files for HTTPS and WSS on the main port; nil serves plain HTTP.
    public var tls: TLSFiles?
    /// Open connections accepted at once; beyond it a connection gets HTTP 503 with `Retry-After`. 0: no limit.
    public var maxConnections: Int
    /// The `Retry-After` seconds of a 503 for too many connections.
    public var connectionRetryAfter: Int
    /// Publish messages per `publishWindow` from one client IP over HTTP; nil: no limit.
    public var publishLimitPerIP: Int?
    /// Publish messages per `publishWindow` carrying one publish token over HTTP; nil: no limit.
    public var publishLimitPerToken: Int?
    public var publishWindow: TimeAmount
    /// Take the client address for the per-IP limit from the last `X-Forwarded-For` entry (the address the
    /// reverse proxy in front saw). Only behind a proxy that sets it: otherwise clients could pick their own.
    public var trustForwardedFor: Bool
    /// A separate port for `/metrics`, `/healthz` and `/readyz` (on the same host); nil serves them on the main
    /// port. With a metrics port, the main port no longer answers `/metrics`.
    public var metricsPort: Int?
    /// Whether to talk to systemd: `READY=1`, `STATUS=`, `STOPPING=1`, the watchdog, and listening sockets
    /// passed by socket activation. Silently nothing when the process was not started by systemd.
    public var systemd: Bool
    /// How often the `STATUS=` line is refreshed.
    public var statusInterval: TimeAmount
    /// How long a graceful drain (SIGTERM) may take before the remaining connections are closed.
    public var drainTimeout: TimeAmount
    /// `SO_REUSEPORT` on the main listener: several broker processes on one host share the port and the kernel
    /// spreads new connections over them (each process holds its own descriptor limit). With the Redis engine
    /// they form one cluster; with the memory engine each process is a broker of its own, so use it with Redis.
    public var reusePort: Bool

    public struct TLSFiles: Sendable, Equatable {
        public var certificatePath: String
        public var keyPath: String

        public init(certificatePath: String, keyPath: String) {
            self.certificatePath = certificatePath
            self.keyPath = keyPath
        }
    }

    public init(
        tls: TLSFiles? = nil,
        maxConnections: Int = 0,
        connectionRetryAfter: Int = 1,
        publishLimitPerIP: Int? = nil,
        publishLimitPerToken: Int? = nil,
        publishWindow: TimeAmount = .seconds(1),
        trustForwardedFor: Bool = false,
        metricsPort: Int? = nil,
        systemd: Bool = false,
        statusInterval: TimeAmount = .seconds(5),
        drainTimeout: TimeAmount = .seconds(10),
        reusePort: Bool = false
    ) {
        self.tls = tls
        self.maxConnections = maxConnections
        self.connectionRetryAfter = connectionRetryAfter
        self.publishLimitPerIP = publishLimitPerIP
        self.publishLimitPerToken = publishLimitPerToken
        self.publishWindow = publishWindow
        self.trustForwardedFor = trustForwardedFor
        self.metricsPort = metricsPort
        self.systemd = systemd
        self.statusInterval = statusInterval
        self.drainTimeout = drainTimeout
        self.reusePort = reusePort
    }
}
