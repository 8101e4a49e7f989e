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

    private struct State {
        var channel: (any Channel)?
        var connected = false
        var closed = false
        var attempt = 0
        var reconnect: Scheduled<Void>?
    }
    private let state = NIOLockedValueBox(State())

    /// `onPush` makes this a subscriber connection: pushes (`message`, `subscribe`, …) go there.
    public init(
        configuration: RedisConfiguration,
        eventLoop: any EventLoop,
        name: String = "commands",
        setup: [RESPCommand] = [],
        logger: Logger = Logger(label: "pubsub.redis"),
        onPush: (@Sendable (RESPValue) -> Void)? = nil,
        onEvent: @escaping @Sendable (Event) -> Void = { _ in }
    ) {
        self.configuration = configuration
        self.eventLoop = eventLoop
        self.name = name
        self.setup = setup
        self.logger = logger
        self.onPush = onPush
        self.onEvent = onEvent
    }

    public var isConnected: Bool { state.withLockedValue { $0.connected } }

    /// Starts connecting; `Event.connected` follows when it worked.
    public func start() {
        eventLoop.execute { self.connect() }
    }

    private func connect() {
        let canStart = state.withLockedValue { s -> Bool in
            s.reconnect = nil
            return !s.closed && s.channel == nil
        }
        guard canStart else { return }
        let decoderLimits = configuration.decoderLimits
        let timeout = configuration.commandTimeout
        let onPush = self.onPush
        ClientBootstrap(group: eventLoop)
            .connectTimeout(configuration.connectTimeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(ByteToMessageHandler(RESPMessageDecoder(decoder: RESPDecoder(limits: decoderLimits))))
                    try sync.addHandler(RedisConnectionHandler(timeout: timeout, onPush: onPush))
                }
            }
            .connect(host: configuration.host, port: configuration.port)
            .flatMap { channel in self.prepare(channel).map { channel } }
            .whenComplete { result in
                switch result {
                case .success(let channel):
                    let keep = self.state.withLockedValue { s -> Bool in
                        guard !s.closed else { return false }
                        s.channel = channel
                        s.connected = true
                        s.attempt = 0
                        return true
                    }
                    guard keep else {
                        channel.close(promise: nil)
                        return
                    }
                    channel.closeFuture.whenComplete { _ in self.lost(channel, RedisError(.connectionClosed)) }
                    self.logger.debug("redis connected", metadata: ["pubsub.redis.connection": "\(self.name)"])
                    self.onEvent(.connected)
                case .failure(let error):
                    self.scheduleReconnect(after: error)
                }
            }
    }

    /// AUTH, SELECT and the setup commands (SCRIPT LOAD), before anyone else may use the connection.
    private func prepare(_ channel: any Channel) -> EventLoopFuture<Void> {
        var commands: [RESPCommand] = []
        if let password = configuration.password {
            if let user = configuration.username {
                commands.append(RESPCommand("AUTH", .string(user), .string(password)))
            } else {
                commands.append(RESPCommand("AUTH", .string(password)))
            }
        }
        if configuration.database != 0 {
            commands.append(RESPCommand("SELECT", .integer(Int64(configuration.database))))
        }
        commands += setup
        guard !commands.isEmpty else { return channel.eventLoop.makeSucceededVoidFuture() }
        return Self.write(commands, to: channel).flatMapThrowing { [commands] replies in
            for (command, reply) in zip(commands, replies) {
                if case .error(let message) = reply {
                    throw RedisError(.server, "\(command) failed: \(message)")
                }
            }
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
            logger.debug("redis connection failed", metadata: [
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
        return Self.write(commands, to: channel)
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

    /// Closes for good.
    public func close() -> EventLoopFuture<Void> {
        let (channel, reconnect) = state.withLockedValue { s -> ((any Channel)?, Scheduled<Void>?) in
            s.closed = true
            s.connected = false
            defer { s.channel = nil; s.reconnect = nil }
            return (s.channel, s.reconnect)
        }
        reconnect?.cancel()
        guard let channel else { return eventLoop.makeSucceededVoidFuture() }
        return channel.close().recover { _ in }
    }
}
