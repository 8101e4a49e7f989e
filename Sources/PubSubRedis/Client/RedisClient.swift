import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// One Redis connection that reconnects by itself, with growing delays, until closed.
///
/// Commands are pipelined: `send` writes at once and its future completes with the reply. While disconnected,
/// `send` fails at once with `.notConnected` (the caller decides what to do; nothing is queued unbounded).
/// A subscriber client (`onPush` set) receives pub/sub messages there, on `eventLoop`, in Redis' order.
public final class RedisClient: Sendable {
    public enum Event: Sendable {
        /// Connected, authenticated and on the right database.
        case connected
        /// The connection was lost (or could not be made); a reconnect is scheduled.
        case disconnected(any Error)
    }

    public let configuration: RedisConfiguration
    public let eventLoop: any EventLoop
    private let logger: Logger
    private let onEvent: @Sendable (Event) -> Void
    private let onPush: (@Sendable (RESPValue) -> Void)?
    private let name: String
    private let setup: [RESPCommand]
    private let resolve: (@Sendable () -> EventLoopFuture<RedisEndpoint>)?
    private let verify:
        (
            @Sendable (RedisEndpoint, _ send: @escaping @Sendable ([RESPCommand]) -> EventLoopFuture<[RESPValue]>) ->
                EventLoopFuture<Void>
        )?
    private let onRedirect: (@Sendable (String) -> Void)?

    /// Sends commands on a connection that is being prepared (before anyone else may use it).
    public typealias Sender = @Sendable ([RESPCommand]) -> EventLoopFuture<[RESPValue]>

    private struct State {
        var channel: (any Channel)?
        var endpoint: RedisEndpoint?
        var connected = false
        /// A connection attempt is under way (at most one at a time).
        var connecting = false
        var closed = false
        var attempt = 0
        var reconnect: Scheduled<Void>?
        var lastError: (any Error)?
    }
    private let state = NIOLockedValueBox(State())

    /// `onPush` makes this a subscriber connection: pushes (`message`, `subscribe`, …) go there.
    /// `resolve` says where to connect at each attempt (Sentinel discovery); without it, the configuration's
    /// host and port. `verify` runs on each new connection after the setup commands, before it is used (a
    /// failed future drops it). `onRedirect` makes a `READONLY` or `MOVED` error reply drop the connection (the
    /// server was demoted to a replica, or no longer serves the slot) and is told the reply.
    public init(
        configuration: RedisConfiguration,
        eventLoop: any EventLoop,
        name: String = "commands",
        setup: [RESPCommand] = [],
        logger: Logger = Logger(label: "pubsub.redis"),
        resolve: (@Sendable () -> EventLoopFuture<RedisEndpoint>)? = nil,
        verify: (@Sendable (RedisEndpoint, _ send: @escaping Sender) -> EventLoopFuture<Void>)? = nil,
        onRedirect: (@Sendable (String) -> Void)? = nil,
        onPush: (@Sendable (RESPValue) -> Void)? = nil,
        onEvent: @escaping @Sendable (Event) -> Void = { _ in }
    ) {
        self.configuration = configuration
        self.eventLoop = eventLoop
        self.name = name
        self.setup = setup
        self.logger = logger
        self.resolve = resolve
        self.verify = verify
        self.onRedirect = onRedirect
        self.onPush = onPush
        self.onEvent = onEvent
    }

    public var isConnected: Bool { state.withLockedValue { $0.connected } }

    /// Why the last connection attempt failed (nil once connected), for the operator.
    public var lastError: (any Error)? { state.withLockedValue { $0.lastError } }

    /// Where the current connection goes (nil while disconnected).
    public var endpoint: RedisEndpoint? { state.withLockedValue { $0.connected ? $0.endpoint : nil } }

    /// Starts connecting; `Event.connected` follows when it worked.
    public func start() {
        eventLoop.execute { self.connect() }
    }

    private func connect() {
        let canStart = state.withLockedValue { s -> Bool in
            s.reconnect = nil
            guard !s.closed, s.channel == nil, !s.connecting else { return false }
            s.connecting = true
            return true
        }
        guard canStart else { return }
        let target =
            resolve?()
            ?? eventLoop.makeSucceededFuture(RedisEndpoint(host: configuration.host, port: configuration.port))
        target.flatMap { endpoint in
            Self.open(configuration: self.configuration, to: endpoint, on: self.eventLoop, onPush: self.onPush)
                .flatMap { channel in self.prepare(channel, endpoint: endpoint).map { (channel, endpoint) } }
        }.whenComplete { result in
            switch result {
            case .success(let (channel, endpoint)):
                let keep = self.state.withLockedValue { s -> Bool in
                    s.connecting = false
                    guard !s.closed else { return false }
                    s.channel = channel
                    s.endpoint = endpoint
                    s.connected = true
                    s.attempt = 0
                    s.lastError = nil
                    return true
                }
                guard keep else {
                    channel.close(promise: nil)
                    return
                }
                channel.closeFuture.whenComplete { _ in self.lost(channel, RedisError(.connectionClosed)) }
                self.logger.debug(
                    "redis connected",
                    metadata: [
                        "pubsub.redis.connection": "\(self.name)", "pubsub.redis.endpoint": "\(endpoint)",
                    ])
                self.onEvent(.connected)
            case .failure(let error):
                self.state.withLockedValue { s in
                    s.connecting = false
                    s.lastError = error
                }
                self.scheduleReconnect(after: error)
            }
        }
    }

    /// A connection with the RESP codec and the pipelining handler (and TLS when the configuration says so).
    static func open(
        configuration: RedisConfiguration, to endpoint: RedisEndpoint, on eventLoop: any EventLoop,
        onPush: (@Sendable (RESPValue) -> Void)?
    ) -> EventLoopFuture<any Channel> {
        let decoderLimits = configuration.decoderLimits
        let timeout = configuration.commandTimeout
        let tls: RedisTLS.Context?
        do {
            tls = try RedisTLS.context(for: configuration)
        } catch {
            return eventLoop.makeFailedFuture(error)
        }
        return ClientBootstrap(group: eventLoop)
            .connectTimeout(configuration.connectTimeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    if let tls {
                        try sync.addHandler(
                            try tls.handler(serverHostname: configuration.tlsServerName ?? endpoint.host))
                    }
                    try sync.addHandler(
                        ByteToMessageHandler(RESPMessageDecoder(decoder: RESPDecoder(limits: decoderLimits))))
                    try sync.addHandler(RedisConnectionHandler(timeout: timeout, onPush: onPush))
                }
            }
            .connect(host: endpoint.host, port: endpoint.port)
    }

    /// One request on a connection of its own, closed after the replies (asking a sentinel).
    public static func request(
        _ commands: [RESPCommand], configuration: RedisConfiguration, to endpoint: RedisEndpoint,
        on eventLoop: any EventLoop
    ) -> EventLoopFuture<[RESPValue]> {
        open(configuration: configuration, to: endpoint, on: eventLoop, onPush: nil).flatMap { channel in
            write(authentication(configuration) + commands, to: channel).always { _ in channel.close(promise: nil) }
                .map { Array($0.dropFirst($0.count - commands.count)) }
        }
    }

    static func authentication(_ configuration: RedisConfiguration) -> [RESPCommand] {
        guard let password = configuration.password else { return [] }
        if let user = configuration.username {
            return [RESPCommand("AUTH", .string(user), .string(password))]
        }
        return [RESPCommand("AUTH", .string(password))]
    }

    /// AUTH, SELECT and the setup commands (SCRIPT LOAD), before anyone else may use the connection.
    private func prepare(_ channel: any Channel, endpoint: RedisEndpoint) -> EventLoopFuture<Void> {
        var commands = Self.authentication(configuration)
        if configuration.database != 0 {
            commands.append(RESPCommand("SELECT", .integer(Int64(configuration.database))))
        }
        commands += setup
        // Over TLS, a first round trip makes the handshake (and a certificate refused) happen here.
        if commands.isEmpty, configuration.tls { commands.append(RESPCommand("PING")) }
        let verify = self.verify
        let sent = commands.isEmpty ? channel.eventLoop.makeSucceededFuture([]) : Self.write(commands, to: channel)
        return sent.flatMapThrowing { [commands] replies in
            for (command, reply) in zip(commands, replies) {
                if case .error(let message) = reply {
                    throw RedisError(.server, "\(command) failed: \(message)")
                }
            }
        }.flatMap { () -> EventLoopFuture<Void> in
            guard let verify else { return channel.eventLoop.makeSucceededVoidFuture() }
            return verify(endpoint) { commands in Self.write(commands, to: channel) }
        }.flatMapErrorThrowing { error in
            channel.close(promise: nil)
            throw error
        }
    }

    private func lost(_ channel: any Channel, _ error: any Error) {
        let wasCurrent = state.withLockedValue { s -> Bool in
            guard s.channel === channel else { return false }
            s.channel = nil
            s.connected = false
            return true
        }
        guard wasCurrent else { return }
        onEvent(.disconnected(error))
        scheduleReconnect(after: error)
    }

    private func scheduleReconnect(after error: any Error) {
        let delay = state.withLockedValue { s -> TimeAmount? in
            guard !s.closed, s.reconnect == nil else { return nil }
            s.attempt += 1
            let first = configuration.backoff.first.nanoseconds
            let last = configuration.backoff.last.nanoseconds
            let exponent = min(s.attempt - 1, 20)
            let base = min(last, first << exponent)
            return .nanoseconds(base / 2 + Int64.random(in: 0...max(1, base / 2)))
        }
        guard let delay else { return }
        if state.withLockedValue({ $0.attempt }) == 1 {
            logger.debug(
                "redis connection failed",
                metadata: [
                    "pubsub.redis.connection": "\(name)", "pubsub.redis.url": "\(configuration.redacted)",
                    "pubsub.error": "\(error)",
                ])
        }
        let task = eventLoop.scheduleTask(in: delay) { self.connect() }
        let keep = state.withLockedValue { s -> Bool in
            guard !s.closed else { return false }
            s.reconnect = task
            return true
        }
        if !keep { task.cancel() }
    }

    /// Sends one command; a Redis error reply fails the future with `.server`.
    public func send(_ command: RESPCommand) -> EventLoopFuture<RESPValue> {
        send([command]).flatMapThrowing { replies in
            if case .error(let message) = replies[0] { throw RedisError(.server, message) }
            return replies[0]
        }
    }

    /// Sends commands in one write; the replies come back in order (error replies included as values).
    public func send(_ commands: [RESPCommand]) -> EventLoopFuture<[RESPValue]> {
        guard let channel = state.withLockedValue({ $0.connected ? $0.channel : nil }) else {
            return eventLoop.makeFailedFuture(RedisError(.notConnected))
        }
        let replies = Self.write(commands, to: channel)
        guard let onRedirect else { return replies }
        return replies.map { replies in
            if let redirect = replies.lazy.compactMap(Self.redirect).first {
                // A replica now, or the slot is served elsewhere: nothing written here counts. Drop the
                // connection; the reconnect finds the master.
                channel.close(promise: nil)
                onRedirect(redirect)
            }
            return replies
        }
    }

    /// The error message of a reply that says another server must be used: `READONLY` or `MOVED`.
    static func redirect(_ reply: RESPValue) -> String? {
        guard case .error(let message) = reply, message.hasPrefix("READONLY") || message.hasPrefix("MOVED ") else {
            return nil
        }
        return message
    }

    /// Writes commands whose replies nobody waits for (SUBSCRIBE on a subscriber connection).
    public func sendWithoutReply(_ commands: [RESPCommand]) {
        guard let channel = state.withLockedValue({ $0.connected ? $0.channel : nil }) else { return }
        var bytes = channel.allocator.buffer(capacity: 64)
        for command in commands { RESPEncoder.write(command, into: &bytes) }
        channel.writeAndFlush(RedisOutbound(bytes: bytes, promises: []), promise: nil)
    }

    private static func write(_ commands: [RESPCommand], to channel: any Channel) -> EventLoopFuture<[RESPValue]> {
        var bytes = channel.allocator.buffer(capacity: 64 * commands.count)
        for command in commands { RESPEncoder.write(command, into: &bytes) }
        let promises = commands.map { _ in channel.eventLoop.makePromise(of: RESPValue.self) }
        channel.writeAndFlush(RedisOutbound(bytes: bytes, promises: promises)).whenFailure { error in
            for p in promises { p.fail(RedisError(.connectionClosed, "\(error)")) }
        }
        if promises.count == 1 { return promises[0].futureResult.map { [$0] } }
        return EventLoopFuture.whenAllSucceed(promises.map(\.futureResult), on: channel.eventLoop)
    }

    /// Drops the connection (as a cut would); a reconnect follows as usual. For tests and operators.
    public func dropConnection() {
        state.withLockedValue { $0.channel }?.close(promise: nil)
    }

    /// Drops the connection, and when none is up, tries again now instead of after the pending delay (a new
    /// master was announced).
    public func reconnectNow() {
        let (channel, pending) = state.withLockedValue { s -> ((any Channel)?, Scheduled<Void>?) in
            guard !s.closed else { return (nil, nil) }
            if s.channel != nil { return (s.channel, nil) }
            defer {
                s.reconnect = nil
                s.attempt = 0
            }
            return (nil, s.reconnect)
        }
        if let channel {
            channel.close(promise: nil)
        } else if let pending {
            pending.cancel()
            eventLoop.execute { self.connect() }
        }
    }

    /// Closes for good.
    public func close() -> EventLoopFuture<Void> {
        let (channel, reconnect) = state.withLockedValue { s -> ((any Channel)?, Scheduled<Void>?) in
            s.closed = true
            s.connected = false
            defer {
                s.channel = nil
                s.reconnect = nil
            }
            return (s.channel, s.reconnect)
        }
        reconnect?.cancel()
        guard let channel else { return eventLoop.makeSucceededVoidFuture() }
        return channel.close().recover { _ in }
    }
}
