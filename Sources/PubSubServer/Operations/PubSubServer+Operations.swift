import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import PubSubCore

extension PubSubServer {
    /// The broker's listening sockets: those systemd passed (socket activation), else one bound to host:port.
    /// The first is the main one. With systemd, a socket named `metrics` (`FileDescriptorName=metrics`) is kept
    /// for the metrics listener instead.
    func bindListeners(_ bootstrap: ServerBootstrap) async throws -> (main: any Channel, extra: [any Channel]) {
        let operations = shared.operations
        var inherited: [Systemd.InheritedSocket] = []
        if configuration.operations.systemd {
            let taken = Systemd.takeInheritedSockets()
            if !taken.rejected.isEmpty {
                shared.logger.warning(
                    "ignoring inherited file descriptors that are not listening stream sockets",
                    metadata: ["pubsub.fds": "\(taken.rejected)"])
            }
            inherited = taken.sockets
        }
        operations.setInheritedMetricsSocket(inherited.first(where: { $0.name == "metrics" })?.descriptor)
        let brokerSockets = inherited.filter { $0.name != "metrics" }
        guard !brokerSockets.isEmpty else {
            return (try await bootstrap.bind(host: configuration.host, port: configuration.port).get(), [])
        }
        var channels: [any Channel] = []
        for socket in brokerSockets {
            channels.append(try await bootstrap.withBoundSocket(socket.descriptor).get())
        }
        shared.logger.info(
            "serving on sockets passed by systemd",
            metadata: ["pubsub.sockets": "\(channels.compactMap { $0.localAddress?.description })"])
        return (channels[0], Array(channels.dropFirst()))
    }

    /// After the listeners accept: the metrics listener, `READY=1`, the watchdog and the `STATUS=` line.
    func startOperations(extraListeners: [any Channel], port: Int) async throws {
        let operations = shared.operations
        operations.addListeners(extraListeners, metrics: false)
        if let metricsChannel = try await bindMetricsListener() {
            operations.addListeners([metricsChannel], metrics: true)
            shared.logger.info(
                "metrics on http://\(metricsChannel.localAddress?.description ?? "?")/metrics",
                metadata: [:])
        }
        operations.setPhase(.serving)
        let engine = broker.engine
        if shared.api.key != nil {
            // Once a second: the rates `/api/info` and the dashboard show, and this node's report for the others.
            let api = shared.api
            let loop = group.next()
            api.rates.record(engine.statistics)
            operations.addTimer(
                loop.scheduleRepeatedTask(initialDelay: .seconds(1), delay: .seconds(1)) { _ in
                    api.rates.record(engine.statistics)
                    api.refreshNodeReport(on: loop)
                })
        }
        operations.startSystemdTimers(engine: engine)
        if let limiter = operations.limiter {
            operations.addTimer(
                group.next().scheduleRepeatedTask(initialDelay: .seconds(30), delay: .seconds(30)) { _ in
                    limiter.prune(now: .now())
                })
        }
        let scheme = operations.tls == nil ? "http" : "https"
        operations.systemd.notify(
            "READY=1\nSTATUS=Listening on \(scheme)://\(configuration.host):\(port)\(configuration.mount)")
    }

    /// The listener of `--metrics-port` (or of the socket systemd passed as `metrics`): plain HTTP with
    /// `/metrics`, `/healthz` and `/readyz` only.
    private func bindMetricsListener() async throws -> (any Channel)? {
        let operations = shared.operations
        let inherited = operations.inheritedMetricsSocket
        guard inherited != nil || configuration.operations.metricsPort != nil else { return nil }
        let shared = self.shared
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 64)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(AcceptGuard(operations: shared.operations))
                }
            }
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if try shared.operations.refuseIfShed(channel, makeGuard: shared.makeConnectionGuard) { return }
                    // Timed like the broker port: a scraper that connects and sends nothing does not stay.
                    try channel.pipeline.syncOperations.addHandler(shared.makeConnectionGuard())
                    // The probe answers what the decoder cannot parse.
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: false)
                    try channel.pipeline.syncOperations.addHandler(HTTPExchangeProbe())
                    try channel.pipeline.syncOperations.addHandler(OperationsHTTPHandler(shared: shared))
                }
            }
        if let inherited { return try await bootstrap.withBoundSocket(inherited).get() }
        return try await bootstrap.bind(host: configuration.host, port: configuration.operations.metricsPort!).get()
    }

    /// The port of the metrics listener, when there is one (useful with `--metrics-port 0`).
    public var metricsPort: Int? { shared.operations.metricsListenerPort }

    /// Reads the TLS certificate and key again (SIGHUP). Connections already open keep theirs; new ones get the
    /// new certificate. On failure the running certificate stays and the error is thrown.
    public func reloadCertificates() throws {
        guard shared.operations.tls != nil else { return }
        do {
            try shared.operations.reloadTLS()
            shared.logger.info("TLS certificate reloaded")
        } catch {
            shared.logger.error(
                "TLS certificate reload failed; keeping the current one", metadata: ["pubsub.error": "\(error)"])
            throw error
        }
    }

    /// Graceful drain: stops accepting, answers every held `/meta/connect` at once (successful, with
    /// `advice.reconnect: "retry"`), closes WebSockets with 1001 and idle HTTP connections, lets responses in
    /// flight finish, and closes what is left when `timeout` is nearly over. Returns within `timeout`.
    public func drain(timeout: TimeAmount? = nil) async {
        let operations = shared.operations
        let timeout = timeout ?? configuration.operations.drainTimeout
        let deadline = NIODeadline.now() + timeout
        guard operations.beginDrain() else { return }
        let open = operations.openConnections
        operations.systemd.notify("STOPPING=1\nSTATUS=Draining: \(open) connections open")
        shared.logger.info(
            "draining", metadata: ["pubsub.connections": "\(open)", "pubsub.drain.timeout": "\(timeout)"])
        operations.stopListenerMembership()
        let (channel, sweeper) = takeListener()
        sweeper?.cancel()
        try? await channel?.close()
        for listener in operations.takeListeners(metrics: false) { try? await listener.close() }
        operations.quiesceConnections()
        broker.engine.shutdown()
        // Leave a moment at the end for closing what is left and stopping the event loops.
        let graceEnd = deadline - min(.seconds(1), .nanoseconds(timeout.nanoseconds / 4))
        while operations.openConnections > 0, NIODeadline.now() < graceEnd {
            try? await Task.sleep(nanoseconds: 20_000_000)
        }
        let left = operations.openConnections
        if left > 0 {
            shared.logger.notice(
                "closing connections still open at the end of the drain", metadata: ["pubsub.connections": "\(left)"])
            operations.closeConnections()
        }
        operations.stopTimers()
        for listener in operations.takeListeners(metrics: true) { try? await listener.close() }
        operations.setPhase(.stopped)
        try? await group.shutdownGracefully()
        shared.logger.info("drained", metadata: ["pubsub.connections.closed": "\(left)"])
    }
}

/// Serves `/metrics`, `/healthz`, `/readyz`, the API and the dashboard on the metrics port, through the same
/// router and responders as the broker's port (`HTTPRouter`); it writes no CORS headers.
final class OperationsHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let shared: ServerShared
    private var head: HTTPRequestHead?
    /// The body of an `/api` call, bounded by `maxRequestBytes` (nil once over it: answered 413).
    private var body: ByteBuffer?
    private var tooLarge = false

    init(shared: ServerShared) { self.shared = shared }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            body = nil
            tooLarge =
                head.headers.first(name: "content-length").flatMap(Int.init).map {
                    $0 > shared.configuration.maxRequestBytes
                } ?? false
        case .body(var chunk):
            guard !tooLarge else { return }
            if (body?.readableBytes ?? 0) + chunk.readableBytes > shared.configuration.maxRequestBytes {
                tooLarge = true
                body = nil
            } else if body == nil {
                body = chunk
            } else {
                body!.writeBuffer(&chunk)
            }
        case .end:
            guard let head else { return }
            self.head = nil
            let reply: HTTPReply
            if tooLarge {
                let r = ServerAPI.error(.payloadTooLarge, "request body too large")
                reply = .now(HTTPResponse(status: r.status, headers: r.headers, body: r.body))
            } else {
                let request = RoutedRequest(
                    head: head, body: body, route: Route(path: head.uri, mount: shared.mount),
                    peerAddress: context.channel.remoteAddress?.ipAddress)
                // Never nil here: the metrics port routes the Bayeux mount to not found.
                reply =
                    HTTPRouter(shared: shared, onMetricsPort: true).reply(to: request, on: context.eventLoop)
                    ?? .now(.text(.notFound, "Not found\n"))
            }
            let response: EventLoopFuture<HTTPResponse>
            switch reply {
            case .now(let r): response = context.eventLoop.makeSucceededFuture(r)
            case .later(let future): response = future
            }
            body = nil
            response.assumeIsolated().whenSuccess { response in
                var response = response
                response.crossOrigin = false
                let (responseHead, body) = ResponseTarget(head).complete(response, keepAlive: head.isKeepAlive)
                context.write(self.wrapOutboundOut(.head(responseHead)), promise: nil)
                if let body { context.write(self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
                let done = context.writeAndFlush(self.wrapOutboundOut(.end(nil)))
                if !head.isKeepAlive { done.assumeIsolated().whenComplete { _ in context.close(promise: nil) } }
            }
        }
    }
}
