import Logging
import NIOConcurrencyHelpers
import NIOCore

/// Runs `ClusterStateMachine`: asks the cluster's nodes which master serves the engine's slot for every
/// (re)connect of the engine's connections, and checks each new connection (`ROLE` master, and a key of the
/// slot answered there rather than `MOVED`) before it is used.
final class ClusterMonitor: MasterLocator {
    let settings: RedisClusterConfiguration
    let eventLoop: any EventLoop
    /// A key of the engine's slot, for the check.
    let probeKey: String
    private let logger: Logger
    private let onRediscover: @Sendable (String) -> Void

    private struct State {
        var machine: ClusterStateMachine
        var failing = false
    }
    private let state: NIOLockedValueBox<State>

    init(
        settings: RedisClusterConfiguration, probeKey: String, eventLoop: any EventLoop, logger: Logger,
        onRediscover: @escaping @Sendable (String) -> Void
    ) {
        self.settings = settings
        self.probeKey = probeKey
        self.eventLoop = eventLoop
        self.logger = logger
        self.onRediscover = onRediscover
        self.state = NIOLockedValueBox(
            State(machine: ClusterStateMachine(seeds: settings.seeds, slot: ClusterSlot.of(probeKey))))
    }

    var slot: Int { state.withLockedValue { $0.machine.slot } }
    var switches: UInt64 { state.withLockedValue { $0.machine.switches } }
    var master: RedisEndpoint? { state.withLockedValue { $0.machine.master } }

    /// A reply that may say the slot is served elsewhere now: `MOVED`, `ASK`, `READONLY`.
    func redirected(_ message: String) {
        let signal: ClusterStateMachine.Signal
        if let (slot, to) = ClusterStateMachine.parseRedirect(message) {
            signal = .moved(slot: slot, to: to)
        } else if message.hasPrefix("READONLY") {
            signal = .readOnly
        } else {
            return
        }
        react(to: signal, because: String(message.prefix(80)))
    }

    /// The notification channel was unsubscribed by the server: its slot moved.
    func unsubscribed() {
        react(to: .unsubscribed, because: "sunsubscribe")
    }

    private func react(to signal: ClusterStateMachine.Signal, because reason: String) {
        let reaction = state.withLockedValue { $0.machine.signal(signal) }
        if reaction == .rediscover { onRediscover(reason) }
    }

    /// Where the slot's master is now.
    func resolve() -> EventLoopFuture<RedisEndpoint> {
        run(state.withLockedValue { $0.machine.discover() })
    }

    private func run(_ action: ClusterStateMachine.DiscoveryAction) -> EventLoopFuture<RedisEndpoint> {
        switch action {
        case .ask(let index, let endpoint):
            return RedisClient.request([RESPCommand("CLUSTER", "SLOTS")], configuration: settings.connection, to: endpoint, on: eventLoop)
                .map { replies -> ClusterStateMachine.NodeReply in
                    if case .error(let message) = replies[0] { return .failed(message) }
                    guard let map = ClusterSlotMap.parse(replies[0], askedHost: endpoint.host) else {
                        return .failed("unreadable CLUSTER SLOTS reply")
                    }
                    return .slots(map)
                }
                .recover { .failed("\($0)") }
                .flatMap { reply in self.run(self.state.withLockedValue { $0.machine.nodeAnswered(index, reply) }) }
        case .connect(let endpoint):
            let recovered = state.withLockedValue { s -> Bool in
                defer { s.failing = false }
                return s.failing
            }
            if recovered { logger.notice("the cluster names the slot's master again", metadata: ["pubsub.redis.endpoint": "\(endpoint)"]) }
            return eventLoop.makeSucceededFuture(endpoint)
        case .fail(let reason):
            let first = state.withLockedValue { s -> Bool in
                defer { s.failing = true }
                return !s.failing
            }
            if first { logger.error("no master found for the engine's slot", metadata: ["pubsub.error": "\(reason)"]) }
            return eventLoop.makeFailedFuture(RedisError(.notConnected, reason))
        }
    }

    /// Checks a new connection: `ROLE` is master and a key of the slot is served there. Fails (dropping the
    /// connection) otherwise. `true` when it replaced another master: a failover followed.
    func verify(_ endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<Bool> {
        send([RESPCommand("ROLE"), RESPCommand("EXISTS", .string(probeKey))]).flatMapThrowing { replies in
            let role = SentinelStateMachine.parseRole(replies[0])
            var movedTo: RedisEndpoint?
            var serves = true
            if case .error(let message) = replies[1] {
                serves = false
                movedTo = ClusterStateMachine.parseRedirect(message)?.to
            }
            let verdict = self.state.withLockedValue { $0.machine.verified(endpoint, role: role, serves: serves, movedTo: movedTo) }
            switch verdict {
            case .use(let switched):
                if switched {
                    self.logger.notice("following the engine's slot to a new master", metadata: ["pubsub.redis.endpoint": "\(endpoint)"])
                }
                return switched
            case .reject:
                let what = role == "master" ? "a master that does not serve slot \(self.slot)" : (role ?? "a server that does not answer ROLE")
                throw RedisError(.notMaster, "\(endpoint) is \(what)")
            }
        }
    }
}
