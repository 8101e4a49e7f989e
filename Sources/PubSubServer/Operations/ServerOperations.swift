import Atomics
import CoreMetrics
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOSSL
import PubSubCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The daemon side of one server: connection accounting and limits, TLS contexts, publish rate limits,
/// metrics, readiness, systemd notifications, and the state of a drain.
final class ServerOperations: Sendable {
    enum Phase: UInt8, Sendable, Equatable, AtomicValue {
        case starting
        case serving
        case draining
        case stopped
    }

    let configuration: OperationsConfiguration
    let metrics: ServerMetrics
    let loopCounters: LoopCounterTable
    let limiter: PublishRateLimiter?
    let systemd: Systemd
    let logger: Logger
    private let loops: [any EventLoop]
    private let tlsBox = NIOLockedValueBox<TLSCertificates?>(nil)
    /// Read by every HTTP response (for `Connection: close` while draining): an atomic, not a lock.
    private let phaseBox = ManagedAtomic(Phase.starting)
    private let listeners = NIOLockedValueBox<(broker: [any Channel], metrics: [any Channel], inheritedMetrics: CInt?)>(
        ([], [], nil))
    private let connections = NIOLockedValueBox<[ObjectIdentifier: any Channel]>([:])
    /// With `--reuse-port` and a connection limit: whether the listener is in the port's group
    /// (`ListenerMembership`), and who closes and binds it (`PubSubServer`).
    private let membership: NIOLockedValueBox<ListenerMembership?>
    private let listenerControl = NIOLockedValueBox<(@Sendable (ListenerMembership.Action) -> Void)?>(nil)
    /// Refusals not yet logged: one log line per burst, not one per refused connection or request.
    private let refusalLog = NIOLockedValueBox<(connections: Int, publishes: Int, lastLogged: NIODeadline?)>(
        (0, 0, nil))
    /// Connections shed at the descriptor ceiling and not yet set up (`markShed`, `refuseIfShed`).
    private let shed = NIOLockedValueBox<Set<ObjectIdentifier>>([])
    private let shedPending = ManagedAtomic(0)
    /// The guard of a shed connection: a client that sends nothing is closed after at most a second, since it
    /// holds the slot that lets the next waiting client be answered.
    let shedGuardSettings: ConnectionGuardSettings
    private let timers = NIOLockedValueBox<[RepeatedTask]>([])
    /// Lines `/readyz` says below the broker's own word (the feeds of `serve --relay`); they never change its status.
    private let readinessNotes = NIOLockedValueBox<[@Sendable () -> [String]]>([])
    private let watchdogBox = NIOLockedValueBox<Watchdog?>(nil)

    /// `metrics`: where the server's metrics are made and how `/metrics` renders them.
    init(
        configuration: OperationsConfiguration, loops: [any EventLoop], metrics backend: MetricsBackend,
        timeouts: ConnectionTimeouts = ConnectionTimeouts(), logger: Logger
    ) {
        self.configuration = configuration
        self.loops = loops
        self.membership = NIOLockedValueBox(
            ListenerMembership(limit: configuration.maxConnections, sharedPort: configuration.reusePort))
        self.metrics = ServerMetrics(backend: backend)
        self.loopCounters = LoopCounterTable(loops: loops)
        self.logger = logger
        self.systemd = configuration.systemd ? Systemd() : Systemd.disabled
        if configuration.systemd, let error = LibSystemd.loadError {
            // A warning when systemd did start this process (it waits for READY=1 or passed sockets in vain),
            // else only a debug line: a container or a shell has no use for libsystemd.
            let startedBySystemd =
                getenv("NOTIFY_SOCKET") != nil || getenv("LISTEN_PID").map { String(cString: $0) } == "\(getpid())"
            logger.log(
                level: startedBySystemd ? .warning : .debug,
                "libsystemd not loaded: systemd notifications, watchdog and socket activation are off",
                metadata: ["pubsub.error": "\(error)"])
        }
        var shedTimeouts = timeouts
        shedTimeouts.header = min(shedTimeouts.header, .seconds(1))
        shedTimeouts.lingerTime = min(shedTimeouts.lingerTime, .seconds(1))
        self.shedGuardSettings = ConnectionGuardSettings(
            timeouts: shedTimeouts, pingInterval: .seconds(30), logger: logger)
        metrics.maxConnections.set(Double(configuration.maxConnections))
        if configuration.publishLimitPerIP != nil || configuration.publishLimitPerToken != nil {
            limiter = PublishRateLimiter(
                .init(
                    perIP: configuration.publishLimitPerIP, perToken: configuration.publishLimitPerToken,
                    window: configuration.publishWindow))
        } else {
            limiter = nil
        }
    }

    // MARK: Phase

    var phase: Phase { phaseBox.load(ordering: .relaxed) }
    var isDraining: Bool { phase.rawValue >= Phase.draining.rawValue }

    func setPhase(_ phase: Phase) {
        phaseBox.store(phase, ordering: .relaxed)
        metrics.draining.set(phase == .draining ? 1.0 : 0.0)
    }

    /// Moves to `.draining`; false when a drain has already begun.
    func beginDrain() -> Bool {
        while true {
            let current = phaseBox.load(ordering: .relaxed)
            if current.rawValue >= Phase.draining.rawValue { return false }
            if phaseBox.compareExchange(expected: current, desired: .draining, ordering: .relaxed).exchanged {
                metrics.draining.set(1.0)
                return true
            }
        }
    }

    // MARK: Listeners and timers

    func setInheritedMetricsSocket(_ descriptor: CInt?) {
        listeners.withLockedValue { $0.inheritedMetrics = descriptor }
    }
    var inheritedMetricsSocket: CInt? { listeners.withLockedValue { $0.inheritedMetrics } }

    func addListeners(_ channels: [any Channel], metrics: Bool) {
        listeners.withLockedValue { l in
            if metrics { l.metrics += channels } else { l.broker += channels }
        }
    }

    func takeListeners(metrics: Bool) -> [any Channel] {
        listeners.withLockedValue { l in
            defer { if metrics { l.metrics = [] } else { l.broker = [] } }
            return metrics ? l.metrics : l.broker
        }
    }

    var hasMetricsListener: Bool {
        configuration.metricsPort != nil || listeners.withLockedValue { !$0.metrics.isEmpty }
    }

    var metricsListenerPort: Int? { listeners.withLockedValue { $0.metrics.first?.localAddress?.port } }

    func addTimer(_ task: RepeatedTask) { timers.withLockedValue { $0.append(task) } }

    // MARK: TLS

    var tls: TLSCertificates? { tlsBox.withLockedValue { $0 } }

    func loadTLS() throws {
        guard let files = configuration.tls else { return }
        let certificates = try TLSCertificates(certificatePath: files.certificatePath, keyPath: files.keyPath)
        tlsBox.withLockedValue { $0 = certificates }
        metrics.tlsNotAfter.set(Double(certificates.notValidAfter))
    }

    /// Reads the certificate and key again; the running ones stay when that fails.
    func reloadTLS() throws {
        guard let certificates = tls else { return }
        do {
            try certificates.reload()
            metrics.tlsReloads.increment()
            metrics.tlsNotAfter.set(Double(certificates.notValidAfter))
        } catch {
            metrics.tlsReloadFailures.increment()
            throw error
        }
    }

    // MARK: Connections

    var openConnections: Int { connections.withLockedValue { $0.count } }

    /// Sets up the start of a new connection's pipeline: TLS when configured, and the 503 answer when the
    /// connection limit is reached. Returns false when the connection was refused (its pipeline is complete).
    /// A refused connection is guarded too (`makeGuard`): its header timeout closes a client that sends no
    /// request, and a request body still arriving after the 503 is drained (lingering close), not reset.
    func prepare(_ channel: any Channel, makeGuard: () -> ConnectionGuard) throws -> Bool {
        let sync = channel.pipeline.syncOperations
        if let tls {
            try sync.addHandler(NIOSSLServerHandler(context: tls.context))
        }
        if try refuseIfShed(channel, makeGuard: makeGuard) { return false }
        let id = ObjectIdentifier(channel)
        let limit = configuration.maxConnections
        let admitted = connections.withLockedValue { open -> Int? in
            if limit > 0, open.count >= limit { return nil }
            open[id] = channel
            return open.count
        }
        guard let admitted else {
            metrics.connectionsRefused.increment()
            noteRefusal(connection: true)
            try addRefusal(
                to: channel, guard: makeGuard(), text: "Too many connections (limit \(limit)); retry later\n")
            return false
        }
        metrics.connectionsAccepted.increment()
        metrics.connectionsOpen.increment()
        // Not before this connection's setup is over: a listener closed while it is set up closes it too (NIO's
        // accept handler drops a connection whose listener is no longer active).
        membershipChanged(after: channel.eventLoop) { $0.opened(open: admitted) }
        channel.closeFuture.whenComplete { [self] _ in
            let open = connections.withLockedValue { connections in
                connections[id] = nil
                return connections.count
            }
            metrics.connectionsOpen.decrement()
            membershipChanged { $0.closed(open: open) }
        }
        if tls != nil { try sync.addHandler(TLSErrorLogger(operations: self)) }
        return true
    }

    /// Whoever closes and binds the listener when `ListenerMembership` says so.
    func controlListener(_ control: @escaping @Sendable (ListenerMembership.Action) -> Void) {
        listenerControl.withLockedValue { $0 = control }
    }

    /// The listener closed (`left`) or a new one is bound (`joined`): the membership moves on, and may ask again.
    func listenerLeft() {
        let open = openConnections
        membershipChanged { $0.left(open: open) }
    }

    func listenerJoined(bound: Bool) {
        let open = openConnections
        membershipChanged { $0.joined(bound: bound, open: open) }
    }

    /// Draining: the listener is not bound again.
    func stopListenerMembership() {
        _ = membership.withLockedValue { $0?.stop() }
    }

    /// Runs an event of the membership and performs its action, out of the lock (in a later task of `after`).
    private func membershipChanged(
        after loop: (any EventLoop)? = nil, _ event: (inout ListenerMembership) -> ListenerMembership.Action
    ) {
        let action = membership.withLockedValue { m -> ListenerMembership.Action in
            guard m != nil else { return .none }
            return event(&m!)
        }
        guard action != .none, let control = listenerControl.withLockedValue({ $0 }) else { return }
        let open = openConnections
        logger.info(
            action == .leave
                ? "near the connection limit: leaving the shared port to the other processes on it"
                : "below the connection limit again: listening on the shared port",
            metadata: ["pubsub.connections": "\(open)", "pubsub.limit": "\(configuration.maxConnections)"])
        if let loop { loop.execute { control(action) } } else { control(action) }
    }

    /// A connection accepted into the slot of a listener's reserve descriptor (`AcceptGuard`), answered 503 by
    /// `refuseIfShed`.
    func markShed(_ channel: any Channel) {
        shed.withLockedValue { _ = $0.insert(ObjectIdentifier(channel)) }
        shedPending.wrappingIncrement(ordering: .relaxed)
    }

    func unmarkShed(_ channel: any Channel) {
        guard shedPending.load(ordering: .relaxed) > 0 else { return }
        if shed.withLockedValue({ $0.remove(ObjectIdentifier(channel)) != nil }) {
            shedPending.wrappingDecrement(ordering: .relaxed)
        }
    }

    /// When `channel` was shed at the descriptor ceiling: sets up its pipeline to answer 503 and close (its
    /// guard's header timeout is short: it holds the reserve's slot) and returns true. Counts it.
    func refuseIfShed(_ channel: any Channel, makeGuard: () -> ConnectionGuard) throws -> Bool {
        // An atomic first: the common path takes no lock.
        guard shedPending.load(ordering: .relaxed) > 0 else { return false }
        let id = ObjectIdentifier(channel)
        guard shed.withLockedValue({ $0.remove(id) != nil }) else { return false }
        shedPending.wrappingDecrement(ordering: .relaxed)
        metrics.connectionsShed.increment()
        try addRefusal(
            to: channel, guard: ConnectionGuard(settings: shedGuardSettings),
            text: "No file descriptor left on the server; retry later\n")
        return true
    }

    /// The pipeline of a refused connection: guarded (a header timeout for a client that sends nothing, a
    /// lingering close over a body still arriving), one 503 with `Retry-After`, then closed.
    private func addRefusal(to channel: any Channel, guard connectionGuard: ConnectionGuard, text: String) throws {
        let sync = channel.pipeline.syncOperations
        try sync.addHandler(connectionGuard)
        // The probe answers what the decoder cannot parse.
        try sync.configureHTTPServerPipeline(withErrorHandling: false)
        try sync.addHandler(HTTPExchangeProbe())
        try sync.addHandler(
            RefusingHandler(status: .serviceUnavailable, retryAfter: configuration.connectionRetryAfter, text: text))
    }

    /// Asks every open connection to finish: idle HTTP connections close, busy ones close after their response,
    /// WebSockets close with 1001.
    func quiesceConnections() {
        for channel in connections.withLockedValue({ Array($0.values) }) {
            channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        }
    }

    /// Closes whatever is still open, at once: no lingering over a request half read.
    func closeConnections() {
        for channel in connections.withLockedValue({ Array($0.values) }) {
            channel.triggerUserOutboundEvent(ConnectionGuard.Event.abort, promise: nil)
            channel.close(promise: nil)
        }
    }

    /// Logs refused connections and rate-limited publishes at most once every 10 seconds, with a count.
    func noteRefusal(connection: Bool) {
        let now = NIODeadline.now()
        let line = refusalLog.withLockedValue { s -> (Int, Int)? in
            if connection { s.connections += 1 } else { s.publishes += 1 }
            if let last = s.lastLogged, now - last < .seconds(10) { return nil }
            defer { s = (0, 0, now) }
            return (s.connections, s.publishes)
        }
        guard let (connections, publishes) = line else { return }
        if connections > 0 {
            logger.warning(
                "connections refused: --max-connections reached",
                metadata: ["pubsub.refused": "\(connections)", "pubsub.limit": "\(configuration.maxConnections)"])
        }
        if publishes > 0 {
            logger.notice("publish requests rate limited", metadata: ["pubsub.refused": "\(publishes)"])
        }
    }

    // MARK: Readiness, metrics and status

    /// Serving, and the engine ready when it says (`EngineObservability`); an engine that does not is ready.
    func isReady(engine: any Engine) -> Bool {
        phase == .serving && ((engine as? any EngineObservability)?.isReady ?? true)
    }

    func addReadinessNotes(_ notes: @escaping @Sendable () -> [String]) {
        readinessNotes.withLockedValue { $0.append(notes) }
    }

    /// The lines of `addReadinessNotes`, each ended by a newline.
    var readinessNoteText: String {
        readinessNotes.withLockedValue { $0 }.flatMap { $0() }.map { $0 + "\n" }.joined()
    }

    /// The text of `/metrics`, after reading the engine and every event loop.
    func renderMetrics(engine: any Engine, on loop: any EventLoop) -> EventLoopFuture<ByteBuffer> {
        let stats = engine.statistics
        let extra = (engine as? any EngineObservability)?.extraMetrics ?? []
        let ready = isReady(engine: engine)
        return loopCounters.collect(on: loop).map { [metrics] loops in
            metrics.update(engine: stats, loops: loops)
            metrics.update(engineMetrics: extra)
            metrics.ready.set(ready ? 1.0 : 0.0)
            metrics.update(memory: .current())
            var bytes: [UInt8] = []
            bytes.reserveCapacity(8192)
            metrics.backend.render(&bytes)
            return ByteBuffer(bytes: bytes)
        }
    }

    /// Starts the watchdog (when the unit has `WatchdogSec=`) and the `STATUS=` refresh.
    func startSystemdTimers(engine: any Engine) {
        guard systemd.isNotifying, let first = loops.first else { return }
        if let interval = systemd.watchdogInterval() {
            let half = TimeAmount.nanoseconds(max(1_000_000, interval.nanoseconds / 2))
            let watchdog = Watchdog(loops: loops) { [systemd] in systemd.notify("WATCHDOG=1") }
            watchdogBox.withLockedValue { $0 = watchdog }
            watchdog.start(every: half)
            logger.debug("systemd watchdog on", metadata: ["pubsub.watchdog.ping": "\(half)"])
        }
        let previous = NIOLockedValueBox<(published: UInt64, delivered: UInt64, at: NIODeadline)>(
            (engine.statistics.published, engine.statistics.queued, .now()))
        let status = first.scheduleRepeatedTask(
            initialDelay: configuration.statusInterval, delay: configuration.statusInterval
        ) {
            [self] _ in
            let stats = engine.statistics
            let now = NIODeadline.now()
            let rates = previous.withLockedValue { p -> (Double, Double) in
                let seconds = max(0.001, Double((now - p.at).nanoseconds) / 1e9)
                defer { p = (stats.published, stats.queued, now) }
                return (
                    Double(stats.published &- p.published) / seconds, Double(stats.queued &- p.delivered) / seconds
                )
            }
            loopCounters.collect(on: first).whenSuccess { [self] loops in
                systemd.notify("STATUS=" + Self.statusLine(stats: stats, loops: loops, rates: rates, phase: phase))
            }
        }
        timers.withLockedValue { $0.append(status) }
    }

    func stopTimers() {
        for timer in timers.withLockedValue({ t -> [RepeatedTask] in
            defer { t = [] }
            return t
        }) {
            timer.cancel()
        }
        watchdogBox.withLockedValue { $0 }?.stop()
    }
}

extension Systemd {
    /// A `Systemd` that never notifies, for servers not configured to talk to systemd.
    static var disabled: Systemd { Systemd(notifying: false) }
}

/// Answers every request of a connection that is not admitted with one fixed response, then closes.
final class RefusingHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let status: HTTPResponseStatus
    let retryAfter: Int
    let text: String
    private var answered = false
    private var head: HTTPRequestHead?

    init(status: HTTPResponseStatus, retryAfter: Int, text: String) {
        self.status = status
        self.retryAfter = retryAfter
        self.text = text
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answered else { return }
        switch unwrapInboundIn(data) {
        case .head(let head):
            // A request with a body is answered at once (the guard lingers over the body still coming); one
            // without is answered at its end, so that the close finds it read and closes without lingering.
            if Self.hasBody(head) { answer(head, context: context) } else { self.head = head }
        case .body:
            break
        case .end:
            if let head { answer(head, context: context) }
        }
    }

    private static func hasBody(_ head: HTTPRequestHead) -> Bool {
        if let length = head.headers.first(name: "content-length") { return length != "0" }
        return head.headers.contains(name: "transfer-encoding")
    }

    private func answer(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
        answered = true
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        headers.add(name: "X-Content-Type-Options", value: "nosniff")
        headers.add(name: "Retry-After", value: String(retryAfter))
        headers.add(name: "Content-Length", value: String(text.utf8.count))
        headers.add(name: "Connection", value: "close")
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))),
            promise: nil)
        if head.method != .HEAD {
            context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: text)))), promise: nil)
        }
        // Sent before a body was read: the connection guard lingers over what is still coming.
        context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }
}

/// Logs a failed TLS handshake once per connection (at info: a client's problem, not the server's).
final class TLSErrorLogger: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny
    let operations: ServerOperations
    private var logged = false

    init(operations: ServerOperations) { self.operations = operations }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !logged, let sslError = error as? NIOSSLError, case .handshakeFailed = sslError {
            logged = true
            operations.metrics.error(.tls)
            operations.logger.info(
                "TLS handshake failed",
                metadata: [
                    "pubsub.remote": "\(context.channel.remoteAddress?.description ?? "?")", "pubsub.error": "\(error)",
                ])
        }
        context.fireErrorCaught(error)
    }
}
