import Logging
import NIOConcurrencyHelpers
import NIOCore

/// The decisions of finding the master the engine's connections use, without sockets or clocks
/// (`SentinelStateMachine`, `ClusterStateMachine`): a discovery asks servers in turn where the master is, each new
/// connection is checked before it is used, and signals (a redirecting reply, an announcement) may ask for the
/// connections to be dropped and the master found again.
protocol MasterDiscovery: Sendable {
    /// What a server asked where the master is answered.
    associatedtype Answer: Sendable
    /// What the check of a new connection found.
    associatedtype Check: Sendable
    associatedtype Signal: Sendable

    /// The last master verified.
    var master: RedisEndpoint? { get }
    /// Masters that replaced a verified one (failovers followed).
    var switches: UInt64 { get }
    /// Starts a discovery round.
    mutating func discover() -> MasterDiscoveryAction
    /// Server `index` of the round answered.
    mutating func answered(_ index: Int, _ answer: Answer) -> MasterDiscoveryAction
    /// A new connection to `endpoint` was checked.
    mutating func checked(_ endpoint: RedisEndpoint, _ check: Check) -> MasterVerdict
    mutating func signal(_ signal: Signal) -> MasterReaction
}

enum MasterDiscoveryAction: Equatable, Sendable {
    /// Ask server `index` where the master is.
    case ask(server: Int, RedisEndpoint)
    /// Connect to this address and check it before it is used.
    case connect(RedisEndpoint)
    /// No server named a master: try again later (the caller backs off).
    case fail(String)
}

enum MasterVerdict: Equatable, Sendable {
    /// Serve on this master; `switched` when it replaced another verified master (a failover followed).
    case use(switched: Bool)
    /// Not the master: drop the connection.
    case reject
}

enum MasterReaction: Equatable, Sendable {
    /// Drop the connections to Redis now and discover the master again.
    case rediscover
    case ignore
}

/// What a `MasterMonitor` does over sockets for its discovery: which request asks a server, which check a new
/// connection gets, and the words of its logs.
protocol MasterSource: Sendable {
    associatedtype Discovery: MasterDiscovery

    func ask(_ server: RedisEndpoint, on eventLoop: any EventLoop) -> EventLoopFuture<Discovery.Answer>
    func check(_ endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<Discovery.Check>
    /// Why a connection the discovery rejected is dropped.
    func rejection(of endpoint: RedisEndpoint, _ check: Discovery.Check) -> String
    /// The signal of an error reply that made a client drop its connection, if it is one, and the reason logged.
    func signal(forReply message: String) -> (Discovery.Signal, reason: String)?

    /// Logged when a master is named again after a failed discovery.
    var foundAgain: Logger.Message { get }
    /// Logged when a discovery fails after one that worked.
    var notFound: Logger.Message { get }
    /// Logged when a new master replaces the one verified before.
    var following: Logger.Message { get }
}

/// Runs a `MasterDiscovery` for the engine's connections (`MasterLocator`): where to connect at each attempt,
/// the check of each new connection, and what a redirecting reply or another signal means. Sentinel and Cluster
/// differ only in their `MasterSource` and their machine.
final class MasterMonitor<Source: MasterSource>: MasterLocator {
    let source: Source
    let eventLoop: any EventLoop
    private let logger: Logger
    /// Told when the connections should be dropped and the master discovered again.
    private let onRediscover: @Sendable (String) -> Void

    private struct State {
        var discovery: Source.Discovery
        /// The last discovery failed (logged once until one works again).
        var failing = false
    }
    private let state: NIOLockedValueBox<State>

    init(
        source: Source, discovery: Source.Discovery, eventLoop: any EventLoop, logger: Logger,
        onRediscover: @escaping @Sendable (String) -> Void
    ) {
        self.source = source
        self.eventLoop = eventLoop
        self.logger = logger
        self.onRediscover = onRediscover
        self.state = NIOLockedValueBox(State(discovery: discovery))
    }

    var master: RedisEndpoint? { state.withLockedValue { $0.discovery.master } }
    var switches: UInt64 { state.withLockedValue { $0.discovery.switches } }

    /// Runs `body` on the discovery, under its lock.
    func withDiscovery<T>(_ body: (inout Source.Discovery) -> T) -> T {
        state.withLockedValue { body(&$0.discovery) }
    }

    /// Where the master is now, asking the servers in turn.
    func resolve() -> EventLoopFuture<RedisEndpoint> {
        run(state.withLockedValue { $0.discovery.discover() })
    }

    private func run(_ action: MasterDiscoveryAction) -> EventLoopFuture<RedisEndpoint> {
        switch action {
        case .ask(let index, let server):
            return source.ask(server, on: eventLoop).flatMap { answer in
                self.run(self.state.withLockedValue { $0.discovery.answered(index, answer) })
            }
        case .connect(let endpoint):
            let recovered = state.withLockedValue { s -> Bool in
                defer { s.failing = false }
                return s.failing
            }
            if recovered { logger.notice(source.foundAgain, metadata: ["pubsub.redis.endpoint": "\(endpoint)"]) }
            return eventLoop.makeSucceededFuture(endpoint)
        case .fail(let reason):
            let first = state.withLockedValue { s -> Bool in
                defer { s.failing = true }
                return !s.failing
            }
            if first { logger.error(source.notFound, metadata: ["pubsub.error": "\(reason)"]) }
            return eventLoop.makeFailedFuture(RedisError(.notConnected, reason))
        }
    }

    /// Checks a new connection; fails (dropping it) unless the discovery accepts it. `true` when it replaced
    /// another master: a failover followed.
    func verify(_ endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<Bool> {
        source.check(endpoint, send: send).flatMapThrowing { check in
            switch self.state.withLockedValue({ $0.discovery.checked(endpoint, check) }) {
            case .use(let switched):
                if switched {
                    self.logger.notice(self.source.following, metadata: ["pubsub.redis.endpoint": "\(endpoint)"])
                }
                return switched
            case .reject:
                throw RedisError(.notMaster, self.source.rejection(of: endpoint, check))
            }
        }
    }

    func redirected(_ message: String) {
        guard let (signal, reason) = source.signal(forReply: message) else { return }
        react(to: signal, because: reason)
    }

    /// Drops the connections when the discovery says `signal` calls for it; `announce` is called first then.
    func react(to signal: Source.Discovery.Signal, because reason: String, announce: () -> Void = {}) {
        guard state.withLockedValue({ $0.discovery.signal(signal) }) == .rediscover else { return }
        announce()
        onRediscover(reason)
    }
}
