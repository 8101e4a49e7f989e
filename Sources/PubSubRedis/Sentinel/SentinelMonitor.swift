import Logging
import NIOConcurrencyHelpers
import NIOCore

/// Runs `SentinelStateMachine`: asks the sentinels where the master is for every (re)connect of the engine's
/// connections, checks with `ROLE` on each new connection that it reached a master, and watches the sentinels'
/// `+switch-master` announcements on a pub/sub connection of its own (to one sentinel, the next at each reconnect).
final class SentinelMonitor: MasterLocator {
    let settings: RedisSentinelConfiguration
    let eventLoop: any EventLoop
    private let logger: Logger
    /// Told when the connections should be dropped and the master discovered again.
    private let onRediscover: @Sendable (String) -> Void

    private struct State {
        var machine: SentinelStateMachine
        /// Which sentinel named each address, for the verdict on `ROLE`.
        var namedBy: [RedisEndpoint: Int] = [:]
        var failing = false
        var watcher: RedisClient?
    }
    private let state: NIOLockedValueBox<State>

    init(
        settings: RedisSentinelConfiguration, eventLoop: any EventLoop, logger: Logger,
        onRediscover: @escaping @Sendable (String) -> Void
    ) {
        self.settings = settings
        self.eventLoop = eventLoop
        self.logger = logger
        self.onRediscover = onRediscover
        self.state = NIOLockedValueBox(
            State(machine: SentinelStateMachine(sentinels: settings.sentinels, masterName: settings.masterName)))
    }

    var failoversFollowed: UInt64 { state.withLockedValue { $0.machine.switches } }
    var master: RedisEndpoint? { state.withLockedValue { $0.machine.master } }

    /// Starts watching `+switch-master`.
    func start() {
        let watcher = RedisClient(
            configuration: settings.sentinelConnection, eventLoop: eventLoop, name: "sentinel", logger: logger,
            resolve: { [state, eventLoop] in
                eventLoop.makeSucceededFuture(state.withLockedValue { $0.machine.nextWatchedSentinel() })
            },
            onPush: { [weak self] push in self?.received(push) },
            onEvent: { [weak self] event in
                guard case .connected = event else { return }
                self?.state.withLockedValue { $0.watcher }?.sendWithoutReply([RESPCommand("SUBSCRIBE", "+switch-master")])
            })
        state.withLockedValue { $0.watcher = watcher }
        watcher.start()
    }

    func close() -> EventLoopFuture<Void> {
        guard let watcher = state.withLockedValue({ $0.watcher }) else { return eventLoop.makeSucceededVoidFuture() }
        return watcher.close()
    }

    private func received(_ push: RESPValue) {
        guard let parts = push.array, parts.count == 3, parts[0].string == "message", parts[1].string == "+switch-master",
            let text = parts[2].string, let (name, to) = SentinelStateMachine.parseSwitchMaster(text)
        else { return }
        let reaction = state.withLockedValue { $0.machine.signal(.switchMaster(name: name, to: to)) }
        guard reaction == .rediscover else { return }
        logger.notice("sentinel announced a new master", metadata: [
            "pubsub.redis.master_name": "\(name)", "pubsub.redis.endpoint": "\(to)",
        ])
        onRediscover("+switch-master")
    }

    func redirected(_ message: String) {
        if message.hasPrefix("READONLY") { readOnly() }
    }

    /// A write was refused with `READONLY`.
    func readOnly() {
        let reaction = state.withLockedValue { $0.machine.signal(.readOnly) }
        if reaction == .rediscover { onRediscover("READONLY") }
    }

    /// Where the master is now, asking the sentinels in turn.
    func resolve() -> EventLoopFuture<RedisEndpoint> {
        run(state.withLockedValue { $0.machine.discover() })
    }

    private func run(_ action: SentinelStateMachine.DiscoveryAction) -> EventLoopFuture<RedisEndpoint> {
        switch action {
        case .ask(let index, let endpoint):
            let command = RESPCommand("SENTINEL", "get-master-addr-by-name", .string(settings.masterName))
            return RedisClient.request([command], configuration: settings.sentinelConnection, to: endpoint, on: eventLoop)
                .map { SentinelStateMachine.parseMasterAddress($0[0]) }
                .recover { .failed("\($0)") }
                .flatMap { reply in
                    self.run(self.state.withLockedValue { $0.machine.sentinelAnswered(index, reply) })
                }
        case .connect(let endpoint, let index):
            let first = state.withLockedValue { s -> Bool in
                s.namedBy[endpoint] = index
                if s.namedBy.count > 64 { s.namedBy = [endpoint: index] }
                defer { s.failing = false }
                return s.failing
            }
            if first { logger.notice("sentinels name a master again", metadata: ["pubsub.redis.endpoint": "\(endpoint)"]) }
            return eventLoop.makeSucceededFuture(endpoint)
        case .fail(let reason):
            let first = state.withLockedValue { s -> Bool in
                defer { s.failing = true }
                return !s.failing
            }
            if first { logger.error("no master found through the sentinels", metadata: ["pubsub.error": "\(reason)"]) }
            return eventLoop.makeFailedFuture(RedisError(.notConnected, reason))
        }
    }

    /// Checks with `ROLE` that a new connection reached a master; fails (dropping it) otherwise.
    /// `switched` is true when it replaced another master: a failover followed.
    func verify(_ endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<Bool> {
        send([RESPCommand("ROLE")]).flatMapThrowing { replies in
            let role = SentinelStateMachine.parseRole(replies[0])
            let verdict = self.state.withLockedValue { s in
                s.machine.roleChecked(endpoint, named: s.namedBy[endpoint] ?? s.machine.preferred, role: role)
            }
            switch verdict {
            case .use(let switched):
                if switched {
                    self.logger.notice("following the new Redis master", metadata: ["pubsub.redis.endpoint": "\(endpoint)"])
                }
                return switched
            case .reject:
                throw RedisError(.notMaster, "\(endpoint) is a \(role ?? "server that does not answer ROLE"), not the master")
            }
        }
    }
}
