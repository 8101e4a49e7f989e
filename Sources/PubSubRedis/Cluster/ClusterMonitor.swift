import Logging
import NIOCore

/// Asks the cluster's nodes which master serves the engine's slot (`CLUSTER SLOTS`) and checks each new
/// connection (`ROLE` master, and a key of the slot answered there rather than `MOVED`): `ClusterStateMachine` run
/// by a `MasterMonitor`.
struct ClusterSource: MasterSource {
    typealias Discovery = ClusterStateMachine
    let settings: RedisClusterConfiguration
    /// A key of the engine's slot, for the check.
    let probeKey: String

    func ask(_ server: RedisEndpoint, on eventLoop: any EventLoop) -> EventLoopFuture<ClusterStateMachine.NodeReply> {
        RedisClient.request(
            [RESPCommand("CLUSTER", "SLOTS")], configuration: settings.connection, to: server, on: eventLoop
        )
        .map { replies -> ClusterStateMachine.NodeReply in
            if case .error(let message) = replies[0] { return .failed(message) }
            guard let map = ClusterSlotMap.parse(replies[0], askedHost: server.host) else {
                return .failed("unreadable CLUSTER SLOTS reply")
            }
            return .slots(map)
        }
        .recover { .failed("\($0)") }
    }

    func check(_ endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<
        ClusterStateMachine.Check
    > {
        send([RESPCommand("ROLE"), RESPCommand("EXISTS", .string(probeKey))]).map { replies in
            var check = ClusterStateMachine.Check(role: SentinelStateMachine.parseRole(replies[0]), serves: true)
            if case .error(let message) = replies[1] {
                check.serves = false
                check.movedTo = ClusterStateMachine.parseRedirect(message)?.to
            }
            return check
        }
    }

    func rejection(of endpoint: RedisEndpoint, _ check: ClusterStateMachine.Check) -> String {
        let what =
            check.role == "master"
            ? "a master that does not serve slot \(ClusterSlot.of(probeKey))"
            : (check.role ?? "a server that does not answer ROLE")
        return "\(endpoint) is \(what)"
    }

    /// `MOVED`, `ASK`, `READONLY`: the slot may be served elsewhere now.
    func signal(forReply message: String) -> (ClusterStateMachine.Signal, reason: String)? {
        if let (slot, to) = ClusterStateMachine.parseRedirect(message) {
            return (.moved(slot: slot, to: to), String(message.prefix(80)))
        }
        if message.hasPrefix("READONLY") { return (.readOnly, String(message.prefix(80))) }
        return nil
    }

    var foundAgain: Logger.Message { "the cluster names the slot's master again" }
    var notFound: Logger.Message { "no master found for the engine's slot" }
    var following: Logger.Message { "following the engine's slot to a new master" }
}

/// The master's monitor in Redis Cluster mode: follows the master serving the engine's slot.
typealias ClusterMonitor = MasterMonitor<ClusterSource>

extension MasterMonitor where Source == ClusterSource {
    convenience init(
        settings: RedisClusterConfiguration, probeKey: String, eventLoop: any EventLoop, logger: Logger,
        onRediscover: @escaping @Sendable (String) -> Void
    ) {
        self.init(
            source: ClusterSource(settings: settings, probeKey: probeKey),
            discovery: ClusterStateMachine(seeds: settings.seeds, slot: ClusterSlot.of(probeKey)),
            eventLoop: eventLoop, logger: logger, onRediscover: onRediscover)
    }

    var slot: Int { withDiscovery { $0.slot } }

    /// The notification channel was unsubscribed by the server: its slot moved.
    func unsubscribed() {
        react(to: .unsubscribed, because: "sunsubscribe")
    }
}
