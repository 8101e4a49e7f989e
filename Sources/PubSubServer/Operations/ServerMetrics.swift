import Bayeux
import CoreMetrics
import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Counters kept by the handlers of one event loop and touched on that loop only: plain integers, no atomics
/// and no locks on the data path. `/metrics` collects them from every loop at scrape time.
// @unchecked: loop-bound without `NIOLoopBound`: counted on its loop only, on every write, and read on that loop
// (`submit`) at scrape time.
final class LoopCounters: @unchecked Sendable {
    /// Response and frame payload bytes written (HTTP bodies, EventSource events, WebSocket frames).
    var bytesOut: UInt64 = 0
    /// Clients attached right now, by `ConnectionType` (index in `ConnectionType.allCases`): open WebSockets,
    /// open EventSource streams, held long-poll connects.
    var clients = [Int](repeating: 0, count: ConnectionType.allCases.count)

    static func index(_ type: ConnectionType) -> Int {
        switch type {
        case .longPolling: 0
        case .crossOriginLongPolling: 1
        case .callbackPolling: 2
        case .websocket: 3
        case .eventSource: 4
        case .inProcess: 5
        }
    }

    func attached(_ type: ConnectionType) { clients[Self.index(type)] += 1 }
    func detached(_ type: ConnectionType) { clients[Self.index(type)] -= 1 }

    struct Snapshot: Sendable {
        var bytesOut: UInt64
        var clients: [Int]
    }

    var snapshot: Snapshot { Snapshot(bytesOut: bytesOut, clients: clients) }
}

/// The `LoopCounters` of each event loop of a group, fixed when the server is built.
struct LoopCounterTable: Sendable {
    private let table: [ObjectIdentifier: (loop: any EventLoop, counters: LoopCounters)]

    init(loops: [any EventLoop]) {
        var table: [ObjectIdentifier: (loop: any EventLoop, counters: LoopCounters)] = [:]
        for loop in loops { table[ObjectIdentifier(loop)] = (loop, LoopCounters()) }
        self.table = table
    }

    /// The counters of `loop`; a loop outside the group (a test's embedded loop) gets counters nobody reads.
    func counters(for loop: any EventLoop) -> LoopCounters {
        table[ObjectIdentifier(loop)]?.counters ?? LoopCounters()
    }

    /// Reads every loop's counters on that loop and adds them up.
    func collect(on loop: any EventLoop) -> EventLoopFuture<LoopCounters.Snapshot> {
        let reads = table.values.map { entry in entry.loop.submit { entry.counters.snapshot } }
        return EventLoopFuture.whenAllSucceed(reads, on: loop).map { snapshots in
            var total = LoopCounters.Snapshot(
                bytesOut: 0, clients: [Int](repeating: 0, count: ConnectionType.allCases.count))
            for s in snapshots {
                total.bytesOut &+= s.bytesOut
                for i in total.clients.indices { total.clients[i] += s.clients[i] }
            }
            return total
        }
    }
}

/// Request errors by kind, the `kind` label of `pubsub_request_errors_total`.
enum RequestErrorKind: String, CaseIterable, Sendable {
    case badRequest = "bad_request"
    case payloadTooLarge = "payload_too_large"
    case serverError = "server_error"
    case websocketProtocol = "websocket_protocol"
    case websocketTooLarge = "websocket_message_too_large"
    case tls = "tls"
    case connection = "connection"
}

/// Every metric of the server, made with swift-metrics types from the server's `MetricsBackend` (gauges are
/// `Meter`s). Handles are made once. Values that the engine and the event loops keep themselves (clients,
/// subscriptions, messages, bytes) are read when `/metrics` is scraped, so the fan-out path makes no metric call
/// per recipient, or at all.
final class ServerMetrics: Sendable {
    /// The last request errors, for the server API's `/api/errors` and the dashboard.
    let recentErrors = RecentErrors()
    let backend: MetricsBackend

    let connectionsOpen: Meter
    let connectionsAccepted: Counter
    let connectionsRefused: Counter
    /// Connections accepted into the reserve descriptor's slot at the descriptor ceiling, answered 503.
    let connectionsShed: Counter
    /// Failed accepts by errno (`AcceptGuard`).
    let acceptErrors: [CInt: Counter]
    let descriptorLimit: Meter
    let maxConnections: Meter
    let clients: [Meter]
    let sessions: Meter
    let subscriptions: Meter
    let channels: Meter
    let queueDepth: Meter
    let published: Counter
    let delivered: Counter
    let bytesOut: Counter
    let slowConsumerDrops: Counter
    let sessionsExpired: Counter
    let resent: Counter
    let requestErrors: [RequestErrorKind: Counter]
    /// Counted by the HTTP transport's handlers (`HandlerCounter`).
    let rateLimited: [PublishRateLimiter.Scope: HandlerCounter]
    let ready: Meter
    let draining: Meter
    let tlsNotAfter: Meter
    let tlsReloads: Counter
    let tlsReloadFailures: Counter
    /// `/api` requests without the right key, and those answered 429 for too many of them from one address.
    let apiAuthFailures: Counter
    let apiAuthThrottled: Counter
    /// The heap in use and the resident set (`ProcessMemory`), read at each scrape; nil where the platform does
    /// not tell (then the metric is not served).
    let heapAllocated: Meter?
    let resident: Meter?

    /// The engine's own metrics, made at their first scrape; counters with the total already added.
    private let engineMetrics = NIOLockedValueBox<[String: (counter: Counter?, gauge: Meter?, seen: UInt64)]>([:])

    /// Engine and loop totals already turned into counter increments.
    private let seen = NIOLockedValueBox<
        (published: UInt64, delivered: UInt64, bytes: UInt64, drops: UInt64, expired: UInt64, resent: UInt64)
    >((0, 0, 0, 0, 0, 0))

    init(backend: MetricsBackend) {
        self.backend = backend
        let r = backend
        connectionsOpen = r.gauge("pubsub_connections", help: "Open TCP connections on the broker port.")
        connectionsAccepted = r.counter(
            "pubsub_connections_accepted_total", help: "Connections accepted on the broker port.")
        let refusedHelp =
            "Connections answered 503: max_connections when --max-connections were open, descriptors when no file descriptor was left (accepted through the reserve descriptor)."
        connectionsRefused = r.counter(
            "pubsub_connections_refused_total", [("reason", "max_connections")], help: refusedHelp)
        connectionsShed = r.counter("pubsub_connections_refused_total", [("reason", "descriptors")], help: refusedHelp)
        var acceptErrors: [CInt: Counter] = [:]
        for (code, name) in [(EMFILE, "EMFILE"), (ENFILE, "ENFILE"), (ENOBUFS, "ENOBUFS"), (ENOMEM, "ENOMEM")] {
            acceptErrors[code] = r.counter(
                "pubsub_accept_errors_total", [("error", name)],
                help: "Accepts that failed on a listening socket, by errno; each one backs off or sheds a connection.")
        }
        self.acceptErrors = acceptErrors
        descriptorLimit = r.gauge(
            "pubsub_file_descriptor_limit",
            help: "The soft file descriptor limit (RLIMIT_NOFILE) of the process; 0 when unlimited.")
        if let limit = DescriptorLimit.current() { descriptorLimit.set(limit.soft == Int.max ? 0 : Double(limit.soft)) }
        maxConnections = r.gauge("pubsub_max_connections", help: "The --max-connections in force; 0 when unlimited.")
        clients = ConnectionType.allCases.map {
            r.gauge(
                "pubsub_clients", [("transport", $0.rawValue)],
                help:
                    "Clients attached now by transport: open WebSockets and EventSource streams, held long-poll connects."
            )
        }
        sessions = r.gauge("pubsub_sessions", help: "Bayeux sessions (client ids) alive in the engine.")
        subscriptions = r.gauge("pubsub_subscriptions", help: "Subscriptions of all sessions.")
        channels = r.gauge("pubsub_channels", help: "Channels and patterns with at least one subscriber.")
        queueDepth = r.gauge(
            "pubsub_queue_depth", help: "Events waiting in per-client queues, summed over all sessions.")
        published = r.counter("pubsub_messages_published_total", help: "Messages published.")
        delivered = r.counter(
            "pubsub_messages_delivered_total",
            help: "Events queued for delivery to subscribers (one per recipient).")
        bytesOut = r.counter(
            "pubsub_bytes_out_total", help: "Payload bytes written: HTTP bodies, EventSource events, WebSocket frames.")
        slowConsumerDrops = r.counter(
            "pubsub_slow_consumer_drops_total", help: "Clients dropped because their queue overflowed.")
        sessionsExpired = r.counter(
            "pubsub_sessions_expired_total", help: "Sessions removed after no connect for twice the timeout.")
        resent = r.counter(
            "pubsub_events_resent_total",
            help:
                "Events sent again because the connection they were written to was lost before the client confirmed them."
        )
        var errors: [RequestErrorKind: Counter] = [:]
        for kind in RequestErrorKind.allCases {
            errors[kind] = r.counter(
                "pubsub_request_errors_total", [("kind", kind.rawValue)],
                help: "Requests and connections that failed, by kind.")
        }
        requestErrors = errors
        rateLimited = [
            .ip: HandlerCounter(
                r.counter(
                    "pubsub_publish_rate_limited_total", [("scope", "ip")],
                    help: "HTTP publish requests answered 429, by the limit that refused them.")),
            .token: HandlerCounter(
                r.counter(
                    "pubsub_publish_rate_limited_total", [("scope", "token")],
                    help: "HTTP publish requests answered 429, by the limit that refused them.")),
        ]
        ready = r.gauge("pubsub_ready", help: "1 while the broker accepts connections and its engine is ready.")
        draining = r.gauge("pubsub_draining", help: "1 while the broker drains before exiting.")
        tlsNotAfter = r.gauge(
            "pubsub_tls_certificate_not_after_seconds",
            help: "Expiry of the served TLS certificate, seconds since the epoch (0 without TLS).")
        tlsReloads = r.counter("pubsub_tls_reloads_total", [("result", "ok")], help: "Certificate reloads (SIGHUP).")
        tlsReloadFailures = r.counter(
            "pubsub_tls_reloads_total", [("result", "failed")], help: "Certificate reloads (SIGHUP).")
        let apiAuthHelp =
            "Server API requests refused for their key: wrong or missing (401), or too many failures from one address (429)."
        apiAuthFailures = r.counter("pubsub_api_auth_refused_total", [("reason", "wrong_key")], help: apiAuthHelp)
        apiAuthThrottled = r.counter("pubsub_api_auth_refused_total", [("reason", "throttled")], help: apiAuthHelp)
        let memory = ProcessMemory.current()
        heapAllocated = memory.heapAllocated.map { _ in
            r.gauge(
                "pubsub_heap_allocated_bytes",
                help:
                    "Bytes allocated with malloc and not freed (glibc mallinfo2 uordblks + hblkhd): the heap in use, without page granularity."
            )
        }
        resident = memory.resident.map { _ in
            r.gauge("process_resident_memory_bytes", help: "Resident memory size in bytes (VmRSS).")
        }
        update(memory: memory)
    }

    /// Sets the memory gauges; called for each scrape with `ProcessMemory.current()`.
    func update(memory: ProcessMemory) {
        if let bytes = memory.heapAllocated { heapAllocated?.set(Double(bytes)) }
        if let bytes = memory.resident { resident?.set(Double(bytes)) }
    }

    func acceptFailed(_ failure: AcceptBackoffState.Failure, errno code: CInt) {
        acceptErrors[code]?.increment()
    }

    func clients(_ type: ConnectionType) -> Meter { clients[LoopCounters.index(type)] }

    func error(_ kind: RequestErrorKind) {
        requestErrors[kind]?.increment()
        recentErrors.record(kind)
    }

    /// Copies what the engine and the loops counted into the metrics; called for each scrape.
    func update(engine stats: EngineStatistics, loops: LoopCounters.Snapshot) {
        sessions.set(Double(stats.clients))
        subscriptions.set(Double(stats.subscriptions))
        channels.set(Double(stats.channels))
        queueDepth.set(Double(stats.queueDepth))
        for (i, gauge) in clients.enumerated() { gauge.set(Double(loops.clients[i])) }
        let deltas = seen.withLockedValue { s in
            func delta(_ now: UInt64, _ before: inout UInt64) -> Int64 {
                defer { before = max(before, now) }
                return now > before ? Int64(clamping: now - before) : 0
            }
            return (
                delta(stats.published, &s.published), delta(stats.queued, &s.delivered),
                delta(loops.bytesOut, &s.bytes), delta(stats.overflowDrops, &s.drops), delta(stats.expired, &s.expired),
                delta(stats.resent, &s.resent)
            )
        }
        if deltas.0 > 0 { published.increment(by: deltas.0) }
        if deltas.1 > 0 { delivered.increment(by: deltas.1) }
        if deltas.2 > 0 { bytesOut.increment(by: deltas.2) }
        if deltas.3 > 0 { slowConsumerDrops.increment(by: deltas.3) }
        if deltas.4 > 0 { sessionsExpired.increment(by: deltas.4) }
        if deltas.5 > 0 { resent.increment(by: deltas.5) }
    }

    /// Copies what an engine counts beyond the common statistics (the Redis engine's outages and losses).
    func update(engineMetrics samples: [EngineMetric]) {
        guard !samples.isEmpty else { return }
        let backend = self.backend
        engineMetrics.withLockedValue { known in
            for sample in samples {
                var entry =
                    known[sample.name]
                    ?? {
                        switch sample.kind {
                        case .counter: (backend.counter(sample.name, help: sample.help), nil, 0)
                        case .gauge: (nil, backend.gauge(sample.name, help: sample.help), 0)
                        }
                    }()
                if let counter = entry.counter, sample.value > entry.seen {
                    counter.increment(by: Int64(clamping: sample.value - entry.seen))
                }
                entry.gauge?.set(Double(sample.value))
                entry.seen = max(entry.seen, sample.value)
                known[sample.name] = entry
            }
        }
    }
}

/// Counts the replies that carry an error: auth refusals by reason and Bayeux errors by code. It sits last in
/// the extension pipeline and sees replies only (never published events), so it is off the fan-out path.
struct MetricsExtension: BayeuxExtension {
    let authRefusals: [String: Counter]
    let bayeuxErrors: NIOLockedValueBox<[String: Counter]>
    let backend: MetricsBackend

    /// PrivatePub's refusal texts and the `reason` label each is counted under.
    static let authReasons: [(text: String, reason: String)] = [
        (PrivatePubAuth.incorrectSignature, "bad_signature"),
        (PrivatePubAuth.expiredSignature, "expired_signature"),
        (PrivatePubAuth.futureSignature, "future_signature"),
        (PrivatePubAuth.incorrectToken, "bad_token"),
    ]

    init(backend: MetricsBackend) {
        self.backend = backend
        var refusals: [String: Counter] = [:]
        for (text, reason) in Self.authReasons {
            refusals[text] = backend.counter(
                "pubsub_auth_refusals_total", [("reason", reason)],
                help: "Subscribes and publishes refused by the PrivatePub/HMAC check, by reason.")
        }
        authRefusals = refusals
        bayeuxErrors = NIOLockedValueBox([:])
    }

    func outgoing(_ reply: inout Message, context: RequestContext) -> Bool {
        guard let error = reply.error else { return true }
        if let counter = authRefusals[error] {
            counter.increment()
            return true
        }
        let code = String(error.prefix(while: { $0 != ":" }).prefix(3))
        let counter = bayeuxErrors.withLockedValue { counters in
            if let existing = counters[code] { return existing }
            let label = code.count == 3 && code.allSatisfy(\.isNumber) ? code : "other"
            let made = backend.counter(
                "pubsub_bayeux_errors_total", [("code", label)],
                help: "Bayeux replies with an error, by error code (auth refusals are counted apart).")
            counters[code] = made
            return made
        }
        counter.increment()
        return true
    }
}

/// A counter that the transport handlers bump (`rateLimited`): `increment()` is declared here, so that a handler
/// counts without importing CoreMetrics itself.
struct HandlerCounter: Sendable {
    let counter: Counter

    init(_ counter: Counter) { self.counter = counter }

    func increment() { counter.increment() }
}

extension ServerOperations {
    static func statusLine(stats: EngineStatistics, loops: LoopCounters.Snapshot, rates: (Double, Double), phase: Phase)
        -> String
    {
        var byTransport: [String] = []
        for type in ConnectionType.allCases {
            let n = loops.clients[LoopCounters.index(type)]
            if n > 0 { byTransport.append("\(type.rawValue) \(n)") }
        }
        let attached = byTransport.isEmpty ? "" : " (" + byTransport.joined(separator: ", ") + ")"
        let prefix = phase == .draining ? "Draining: " : ""
        return "\(prefix)\(stats.clients) clients\(attached), \(stats.subscriptions) subscriptions; "
            + "\(format(rates.0)) msg/s published, \(format(rates.1)) msg/s delivered"
    }

    private static func format(_ rate: Double) -> String {
        let tenths = Int((rate * 10).rounded())
        return "\(tenths / 10).\(tenths % 10)"
    }
}
