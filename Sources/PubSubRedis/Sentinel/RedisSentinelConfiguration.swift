import NIOCore

/// Redis Sentinel: where the sentinels are and the name of the master they watch.
public struct RedisSentinelConfiguration: Sendable {
    public var sentinels: [RedisEndpoint]
    public var masterName: String
    /// How to talk to the sentinels (password, TLS); its host and port are not used.
    public var sentinelConnection: RedisConfiguration
    /// Positions skipped when the first node reaches a new master, so that an event published there never
    /// takes the position of one the old master had acknowledged but not replicated. Larger than the number of
    /// events a replica can lag behind.
    public var failoverPositionGap: UInt64
    /// How often the sentinels are asked to confirm the master followed (`SentinelStateMachine`).
    public var confirmInterval: TimeAmount
    /// A master no sentinel confirmed for this long keeps the node not ready: it may be a stale one.
    public var unconfirmedAfter: TimeAmount

    public init(
        sentinels: [RedisEndpoint], masterName: String, sentinelConnection: RedisConfiguration = .init(),
        failoverPositionGap: UInt64 = 1_000_000, confirmInterval: TimeAmount = .seconds(1),
        unconfirmedAfter: TimeAmount = .seconds(5)
    ) {
        self.sentinels = sentinels
        self.masterName = masterName
        self.sentinelConnection = sentinelConnection
        self.failoverPositionGap = failoverPositionGap
        self.confirmInterval = confirmInterval
        self.unconfirmedAfter = unconfirmedAfter
    }
}

extension RedisSentinelConfiguration {
    public typealias ParseError = RedisEndpointList.ParseError

    /// Reads `--redis-sentinels` and `--redis-master-name`.
    ///
    /// Sentinels: a comma-separated list of `host[:port]` (port 26379 by default, `[v6]:port` for IPv6) or
    /// `redis[s]://[[user]:password@]host[:port]` (TLS, or a password, to the sentinels; every entry must say
    /// the same). Master: `NAME`, or `redis[s]://[[user]:password@]NAME[/db]` for the master's own password,
    /// database and TLS.
    public static func parse(sentinels list: String, masterName: String) throws -> (
        RedisSentinelConfiguration, master: RedisConfiguration
    ) {
        let (endpoints, connection) = try RedisEndpointList.parse(list, defaultPort: 26379, noun: "sentinel")
        let name = Self.trimmed(Substring(masterName))
        var master = RedisConfiguration()
        var masterID = name
        if name.contains("://") {
            do {
                master = try RedisConfiguration(url: name)
            } catch {
                throw ParseError(description: "invalid master: \(error)")
            }
            masterID = master.host
        }
        guard !masterID.isEmpty, !masterID.contains(" ") else {
            throw ParseError(description: "the master name must not be empty or contain spaces")
        }
        var sentinelConnection = connection
        sentinelConnection.host = endpoints[0].host
        sentinelConnection.port = endpoints[0].port
        return (
            RedisSentinelConfiguration(
                sentinels: endpoints, masterName: masterID, sentinelConnection: sentinelConnection), master
        )
    }

    private static func trimmed(_ text: Substring) -> String {
        RedisEndpointList.trimmed(text)
    }
}
