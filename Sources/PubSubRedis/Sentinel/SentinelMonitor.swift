import Logging
import NIOConcurrencyHelpers
import NIOCore

/// Asks the sentinels where the master is (`SENTINEL get-master-addr-by-name`) and checks with `ROLE` that a new
/// connection reached a master: `SentinelStateMachine` run by a `MasterMonitor`.
struct SentinelSource: MasterSource {
    typealias Discovery = SentinelStateMachine
    let settings: RedisSentinelConfiguration

    func ask(_ server: RedisEndpoint, on eventLoop: any EventLoop) -> EventLoopFuture<
        SentinelStateMachine.SentinelReply
    > {
        let command = RESPCommand("SENTINEL", "get-master-addr-by-name", .string(settings.masterName))
        return RedisClient.request([command], configuration: settings.sentinelConnection, to: server, on: eventLoop)
            .map { SentinelStateMachine.parseMasterAddress($0[0]) }
            .recover { .failed("\($0)") }
    }

    func check(_ endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<String?> {
        send([RESPCommand("ROLE")]).map { SentinelStateMachine.parseRole($0[0]) }
    }

    func rejection(of endpoint: RedisEndpoint, _ role: String?) -> String {
        "\(endpoint) is a \(role ?? "server that does not answer ROLE"), not the master"
    }

    func signal(forReply message: String) -> (SentinelStateMachine.Signal, reason: String)? {
        message.hasPrefix("READONLY") ? (.readOnly, "READONLY") : nil
    }

    var foundAgain: Logger.Message { "sentinels name a master again" }
    var notFound: Logger.Message { "no master found through the sentinels" }
    var following: Logger.Message { "following the new Redis master" }
}

/// The master's monitor in Sentinel mode, a watch on the sentinels' `+switch-master` announcements on a
/// pub/sub connection of its own (to one sentinel, the next at each reconnect), and the confirmation of the
/// master followed, every `confirmInterval` (`SentinelStateMachine`).
final class SentinelMonitor: MasterLocator {
    let settings: RedisSentinelConfiguration
    let eventLoop: any EventLoop
    private let logger: Logger
    private let monitor: MasterMonitor<SentinelSource>
    private let onRediscover: @Sendable (String) -> Void
    private struct Confirming {
        var task: RepeatedTask?
        /// Why the last round confirmed nothing (logged once, until a round confirms again).
        var failure: String?
        var closed = false
    }
    private let watcher = NIOLockedValueBox<RedisClient?>(nil)
    private let confirming = NIOLockedValueBox(Confirming())

    init(
        settings: RedisSentinelConfiguration, eventLoop: any EventLoop, logger: Logger,
        onRediscover: @escaping @Sendable (String) -> Void
    ) {
        self.settings = settings
        self.eventLoop = eventLoop
        self.logger = logger
        self.onRediscover = onRediscover
        self.monitor = MasterMonitor(
            source: SentinelSource(settings: settings),
            discovery: SentinelStateMachine(sentinels: settings.sentinels, masterName: settings.masterName),
            eventLoop: eventLoop, logger: logger, onRediscover: onRediscover)
    }

    var failoversFollowed: UInt64 { monitor.switches }
    var master: RedisEndpoint? { monitor.master }

    func resolve() -> EventLoopFuture<RedisEndpoint> { monitor.resolve() }

    func verify(_ endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<Bool> {
        monitor.verify(endpoint, send: send).map { switched in
            self.monitor.withDiscovery { $0.verified(now: .now()) }
            return switched
        }
    }

    /// A majority of the sentinels named the master followed within `unconfirmedAfter`.
    var isConfirmed: Bool {
        monitor.withDiscovery { $0.isConfirmed(now: .now(), within: settings.unconfirmedAfter) }
    }

    /// Why the master followed is not confirmed, for `/readyz`; nil when it is.
    var unconfirmedNote: String? {
        guard !isConfirmed, let master = monitor.master else { return nil }
        let why = confirming.withLockedValue { $0.failure }.map { ": \($0)" } ?? ""
        let count = monitor.withDiscovery { ($0.quorum, $0.sentinels.count) }
        let who = count.1 == 1 ? "no sentinel has" : "fewer than \(count.0) of the \(count.1) sentinels have"
        return "\(who) named \(master) the master of '\(settings.masterName)' for "
            + "\(settings.unconfirmedAfter.nanoseconds / 1_000_000_000) s\(why)"
    }

    func redirected(_ message: String) { monitor.redirected(message) }

    /// Starts watching `+switch-master`.
    func start() {
        let watcher = RedisClient(
            configuration: settings.sentinelConnection, eventLoop: eventLoop, name: "sentinel", logger: logger,
            resolve: { [monitor, eventLoop] in
                eventLoop.makeSucceededFuture(monitor.withDiscovery { $0.nextWatchedSentinel() })
            },
            onPush: { [weak self] push in self?.received(push) },
            onEvent: { [weak self] event in
                guard case .connected = event else { return }
                self?.watcher.withLockedValue { $0 }?.sendWithoutReply([RESPCommand("SUBSCRIBE", "+switch-master")])
            })
        self.watcher.withLockedValue { $0 = watcher }
        watcher.start()
        let interval = settings.confirmInterval
        let loop = eventLoop
        let task = eventLoop.scheduleRepeatedAsyncTask(initialDelay: interval, delay: interval) { [weak self] _ in
            self?.confirm() ?? loop.makeSucceededVoidFuture()
        }
        let closed = confirming.withLockedValue { c -> Bool in
            c.task = task
            return c.closed
        }
        if closed { task.cancel() }
    }

    func close() -> EventLoopFuture<Void> {
        confirming.withLockedValue { c -> RepeatedTask? in
            c.closed = true
            defer { c.task = nil }
            return c.task
        }?.cancel()
        guard let watcher = watcher.withLockedValue({ $0 }) else { return eventLoop.makeSucceededVoidFuture() }
        return watcher.close()
    }

    /// One confirmation round.
    private func confirm() -> EventLoopFuture<Void> {
        perform(monitor.withDiscovery { $0.confirm() })
    }

    private func perform(_ action: SentinelStateMachine.ConfirmAction) -> EventLoopFuture<Void> {
        switch action {
        case .ask(let index, let server):
            return monitor.source.ask(server, on: eventLoop).flatMap { reply in
                self.perform(self.monitor.withDiscovery { $0.confirmationAnswered(index, reply, now: .now()) })
            }
        case .confirmed:
            let was = confirming.withLockedValue { c -> String? in
                defer { c.failure = nil }
                return c.failure
            }
            if was != nil { logger.notice("the sentinels confirm the Redis master again") }
        case .stale(let named, let by):
            logger.warning(
                "a sentinel names another Redis master than the one followed",
                metadata: [
                    "pubsub.redis.endpoint": "\(monitor.master.map(\.description) ?? "none")",
                    "pubsub.redis.named": "\(named)", "pubsub.redis.sentinel": "\(by)",
                ])
            onRediscover("sentinel \(by) names \(named)")
        case .unconfirmed(let why):
            let first = confirming.withLockedValue { c -> Bool in
                defer { c.failure = why }
                return c.failure == nil
            }
            if first {
                logger.warning(
                    "no majority of the sentinels confirms the Redis master followed",
                    metadata: ["pubsub.error": "\(why)"])
            }
        case .none:
            break
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    private func received(_ push: RESPValue) {
        guard let parts = push.array, parts.count == 3, parts[0].string == "message",
            parts[1].string == "+switch-master",
            let text = parts[2].string, let (name, to) = SentinelStateMachine.parseSwitchMaster(text)
        else { return }
        monitor.react(to: .switchMaster(name: name, to: to), because: "+switch-master") {
            logger.notice(
                "sentinel announced a new master",
                metadata: [
                    "pubsub.redis.master_name": "\(name)", "pubsub.redis.endpoint": "\(to)",
                ])
        }
    }
}
