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

/// The master's monitor in Sentinel mode, and a watch on the sentinels' `+switch-master` announcements on a
/// pub/sub connection of its own (to one sentinel, the next at each reconnect).
final class SentinelMonitor: MasterLocator {
    let settings: RedisSentinelConfiguration
    let eventLoop: any EventLoop
    private let logger: Logger
    private let monitor: MasterMonitor<SentinelSource>
    private let watcher = NIOLockedValueBox<RedisClient?>(nil)

    init(
        settings: RedisSentinelConfiguration, eventLoop: any EventLoop, logger: Logger,
        onRediscover: @escaping @Sendable (String) -> Void
    ) {
        self.settings = settings
        self.eventLoop = eventLoop
        self.logger = logger
        self.monitor = MasterMonitor(
            source: SentinelSource(settings: settings),
            discovery: SentinelStateMachine(sentinels: settings.sentinels, masterName: settings.masterName),
            eventLoop: eventLoop, logger: logger, onRediscover: onRediscover)
    }

    var failoversFollowed: UInt64 { monitor.switches }
    var master: RedisEndpoint? { monitor.master }

    func resolve() -> EventLoopFuture<RedisEndpoint> { monitor.resolve() }

    func verify(_ endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<Bool> {
        monitor.verify(endpoint, send: send)
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
    }

    func close() -> EventLoopFuture<Void> {
        guard let watcher = watcher.withLockedValue({ $0 }) else { return eventLoop.makeSucceededVoidFuture() }
        return watcher.close()
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
