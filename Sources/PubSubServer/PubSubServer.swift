import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOWebSocket
import PubSubCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// What every connection handler of one server shares.
final class ServerShared: Sendable {
    let configuration: ServerConfiguration
    let broker: Broker
    let logger: Logger
    let mount: String
    let operations: ServerOperations
    let api: ServerAPI
    let guardSettings: ConnectionGuardSettings

    init(
        configuration: ServerConfiguration, broker: Broker, logger: Logger, operations: ServerOperations,
        loops: [any EventLoop] = []
    ) {
        self.configuration = configuration
        self.broker = broker
        self.logger = logger
        self.mount = configuration.normalizedMount
        self.operations = operations
        self.api = ServerAPI(
            key: configuration.apiKey, broker: broker, rates: APIRates(), nodeID: ServerAPI.makeNodeID(),
            startedAt: .now(), maxJSONDepth: configuration.maxJSONDepth, errors: operations.metrics.recentErrors,
            metrics: operations.metrics)
        self.guardSettings = ConnectionGuardSettings(
            timeouts: configuration.timeouts, pingInterval: configuration.pingInterval, logger: logger, loops: loops)
    }

    /// The first handler of a connection's pipeline (after TLS): header, idle and send timeouts, WebSocket
    /// pings, lingering close.
    func makeConnectionGuard() -> ConnectionGuard {
        ConnectionGuard(settings: guardSettings)
    }
}

/// The broker on the network: HTTP/1.1 and WebSocket on one port, under one mount path.
public final class PubSubServer: Sendable {
    public let configuration: ServerConfiguration
    public let broker: Broker
    let shared: ServerShared
    let group: MultiThreadedEventLoopGroup
    private let state = NIOLockedValueBox<(channel: (any Channel)?, sweeper: RepeatedTask?)>((nil, nil))

    /// `metrics` is where the server's metrics are made and how `/metrics` renders them: by default a Prometheus
    /// registry of this server's own. `pubsub serve` passes `.prometheus(registry)` with the registry swift-metrics
    /// is bootstrapped with, so that metrics of other components (a relay, the auth hook) appear beside the
    /// broker's. Without `engine`, the broker uses a memory engine.
    public init(
        configuration: ServerConfiguration,
        logger: Logger = Logger(label: "pubsub"),
        metrics: MetricsBackend = .prometheus(),
        engine: (any Engine)? = nil
    ) {
        self.configuration = configuration
        self.group = MultiThreadedEventLoopGroup(
            numberOfThreads: configuration.threads > 0 ? configuration.threads : System.coreCount)
        let operations = ServerOperations(
            configuration: configuration.operations, loops: group.makeIterator().map { $0 }, metrics: metrics,
            timeouts: configuration.timeouts, logger: logger)
        var extensions = configuration.extensions
        extensions.extensions.append(MetricsExtension(backend: metrics))
        self.broker = Broker(
            configuration: configuration.broker, engine: engine, extensions: extensions, logger: logger)
        self.shared = ServerShared(
            configuration: configuration, broker: broker, logger: logger, operations: operations,
            loops: group.makeIterator().map { $0 })
    }

    /// Binds and starts serving; returns the port (useful with port 0).
    @discardableResult
    public func start() async throws -> Int {
        let shared = self.shared
        let upgrader = WebSocketUpgrader(
            compression: configuration.broker.eventCompression != nil,
            shouldUpgrade: { channel, head in
                // The HTTP handler behind the upgrader decides, and serves a refused request with the route it parsed.
                let handler = try? channel.pipeline.syncOperations.handler(type: HTTPHandler.self)
                return handler?.acceptsUpgrade(head) ?? false
            },
            upgradePipeline: { channel, upgradeHead in
                // Frames are read and written by the WebSocket handler itself, limits included (`maxFrameBytes`).
                try channel.pipeline.syncOperations.addHandler(
                    WebSocketHandler(
                        shared: shared, remoteAddress: channel.remoteAddress?.ipAddress,
                        upgradeHeaders: upgradeHead.headers, eventLoop: channel.eventLoop))
            })
        let bootstrap = makeBootstrap(upgrader: upgrader)
        try shared.operations.loadTLS()
        let (channel, extraListeners) = try await bindListeners(bootstrap)
        let engine = broker.engine
        let period = TimeAmount.nanoseconds(
            min(1_000_000_000, max(50_000_000, configuration.broker.timeout.nanoseconds / 4)))
        let sweeper = group.next().scheduleRepeatedTask(initialDelay: period, delay: period) { _ in
            engine.sweep(now: .now())
        }
        state.withLockedValue { $0 = (channel, sweeper) }
        let port = channel.localAddress?.port ?? configuration.port
        if extraListeners.isEmpty { followMembership(upgrader: upgrader, port: port) }
        try await startOperations(extraListeners: extraListeners, port: port)
        return port
    }

    /// HTTP/1.1 with WebSocket upgrade on any request of a keep-alive connection, not only the first: the
    /// exchange probe puts an upgrade handler in front of the HTTP handler for a request that asks for one.
    static func configureHTTP(
        channel: any Channel, shared: ServerShared, upgrader: any HTTPServerProtocolUpgrader & Sendable
    ) throws {
        let sync = channel.pipeline.syncOperations
        let encoder = HTTPResponseEncoder()
        let decoder = ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes))
        let pipelining = HTTPServerPipelineHandler()
        let handler = HTTPHandler(shared: shared)
        // The probe keeps this maker (it gets itself passed, so no cycle), and the maker the HTTP handler.
        let probe = HTTPExchangeProbe { probe in
            HTTPServerUpgradeHandler(
                upgraders: [upgrader], httpEncoder: encoder, extraHTTPHandlers: [decoder, pipelining, probe],
                upgradeCompletionHandler: { context in
                    context.pipeline.syncOperations.removeHandler(handler, promise: nil)
                })
        }
        // After an upgrade the guard hands its timing to the WebSocket's driver and leaves; the probe leaves with
        // the HTTP handlers.
        try sync.addHandler(shared.makeConnectionGuard())
        // No HTTPServerProtocolErrorHandler: the probe answers what the decoder cannot parse.
        try sync.addHandlers([encoder, decoder, pipelining, probe, handler])
    }

    /// Lines for `/readyz` to say below the broker's own word (what the feeds of `serve --relay` are doing), asked
    /// at each request; they never change its status.
    public func addReadinessNotes(_ notes: @escaping @Sendable () -> [String]) {
        shared.operations.addReadinessNotes(notes)
    }

    /// Stops accepting, releases every parked connect and socket, closes, and stops the event loops: a drain
    /// (`drain(timeout:)`) with the configured drain timeout.
    public func shutdown() async throws {
        await drain()
    }

    /// The listener's bootstrap: every accepted connection's pipeline and options.
    private func makeBootstrap(upgrader: WebSocketUpgrader) -> ServerBootstrap {
        let shared = self.shared
        return ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(
                ChannelOptions.Types.SocketOption(
                    level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_REUSEPORT)),
                value: configuration.operations.reusePort ? 1 : 0
            )
            // At the descriptor ceiling: back off and shed instead of spinning on a failing accept.
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(AcceptGuard(operations: shared.operations))
                }
            }
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            // The outbound byte budget: past it a connection is not writable, stops being read, and its events wait
            // in its backlog (`ConnectionStateMachine`).
            .childChannelOption(.writeBufferWaterMark, value: configuration.writeBufferWaterMark)
            // What an idle connection keeps of its reads: NIO's receive pool keeps the first buffer and, with more
            // than one read per wake-up, one per read; the sizer makes the first one small and lets the pool keep
            // no other (`ReceiveBufferSizer`). A read still takes up to 64 KiB: its buffer doubles on a full read.
            .childChannelOption(.maxMessagesPerRead, value: 1)
            .childChannelOption(.recvAllocator, value: ReceiveBufferSizer(minimum: 64, initial: 512, maximum: 65536))
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    guard try shared.operations.prepare(channel, makeGuard: shared.makeConnectionGuard) else { return }
                    // What the kernel may hold of a reader that stopped: bounded, so the send timeout sees the stall.
                    let sendBuffer = shared.configuration.socketSendBuffer
                    if sendBuffer > 0 {
                        try channel.syncOptions?.setOption(
                            .socketOption(.so_sndbuf), value: SocketOptionValue(sendBuffer))
                    }
                    try Self.configureHTTP(channel: channel, shared: shared, upgrader: upgrader)
                }
            }
    }

    /// With `--reuse-port` and a connection limit, closes the listener near the limit and binds a new one on the
    /// same port once below it again, as `ListenerMembership` says (one listener: not with sockets from systemd).
    private func followMembership(upgrader: WebSocketUpgrader, port: Int) {
        let operations = shared.operations
        let host = configuration.host
        guard
            ListenerMembership(
                limit: configuration.operations.maxConnections, sharedPort: configuration.operations.reusePort) != nil
        else { return }
        if ListenerMembership.kernelMigratesQueuedConnections() == false {
            shared.logger.notice(
                "near --max-connections this process leaves the shared port to the others; the kernel resets the few connections still queued on it then (sysctl net.ipv4.tcp_migrate_req=1 hands them over instead)"
            )
        }
        operations.controlListener { [weak self] action in
            guard let self else { return }
            switch action {
            case .none: break
            case .leave:
                let channel = self.state.withLockedValue { s -> (any Channel)? in
                    defer { s.channel = nil }
                    return s.channel
                }
                guard let channel else { return operations.listenerLeft() }
                channel.close().whenComplete { _ in operations.listenerLeft() }
            case .join:
                self.makeBootstrap(upgrader: upgrader).bind(host: host, port: port).whenComplete { result in
                    switch result {
                    case .success(let channel):
                        let kept =
                            operations.phase == .serving
                            && self.state.withLockedValue { s -> Bool in
                                guard s.channel == nil else { return false }
                                s.channel = channel
                                return true
                            }
                        if !kept { channel.close(promise: nil) }
                        operations.listenerJoined(bound: kept)
                    case .failure(let error):
                        self.shared.logger.warning(
                            "could not listen on the shared port again; trying at the next closed connection",
                            metadata: ["pubsub.error": "\(error)"])
                        operations.listenerJoined(bound: false)
                    }
                }
            }
        }
    }

    /// Takes the listening channel and the sweeper, for a drain.
    func takeListener() -> (channel: (any Channel)?, sweeper: RepeatedTask?) {
        state.withLockedValue { s in
            let current = s
            s = (nil, nil)
            return current
        }
    }
}
