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

    public init(
        sentinels: [RedisEndpoint], masterName: String, sentinelConnection: RedisConfiguration = .init(),
        failoverPositionGap: UInt64 = 1_000_000
    ) {
        self.sentinels = sentinels
        self.masterName = masterName
        self.sentinelConnection = sentinelConnection
        self.failoverPositionGap = failoverPositionGap
    }
}


extension RedisSentinelConfiguration {
    public struct ParseError: Error, CustomStringConvertible, Hashable {
        public var description: String
    }

    /// Reads `--redis-sentinels` and `--redis-master-name`.
    ///
    /// Sentinels: a comma-separated list of `host[:port]` (port 26379 by default, `[v6]:port` for IPv6) or
    /// `redis[s]://[[user]:password@]host[:port]` (TLS, or a password, to the sentinels; every entry must say
    /// the same). Master: `NAME`, or `redis[s]://[[user]:password@]NAME[/db]` for the master's own password,
    /// database and TLS.
    public static func parse(sentinels list: String, masterName: String) throws -> (RedisSentinelConfiguration, master: RedisConfiguration) {
        var endpoints: [RedisEndpoint] = []
        var connection: RedisConfiguration?
        for raw in list.split(separator: ",") {
            let entry = Self.trimmed(raw)
            guard !entry.isEmpty else { continue }
            var url = entry.contains("://") ? entry : "redis://" + entry
            // A sentinel listens on 26379 unless told otherwise.
            if !Self.hasPort(url) { url = Self.withPort(url, 26379) }
            let parsed: RedisConfiguration
            do {
                parsed = try RedisConfiguration(url: url)
            } catch {
                throw ParseError(description: "invalid sentinel '\(entry)': \(error)")
            }
            var shared = parsed
            shared.host = ""
            shared.port = 0
            if let connection, connection != shared {
                throw ParseError(description: "every sentinel must use the same scheme and password")
            }
            connection = shared
            endpoints.append(RedisEndpoint(host: parsed.host, port: parsed.port))
        }
        guard !endpoints.isEmpty else { throw ParseError(description: "no sentinel given (host:port,host:port)") }
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
        var sentinelConnection = connection ?? RedisConfiguration()
        sentinelConnection.host = endpoints[0].host
        sentinelConnection.port = endpoints[0].port
        return (RedisSentinelConfiguration(sentinels: endpoints, masterName: masterID, sentinelConnection: sentinelConnection), master)
    }

    private static func trimmed(_ text: Substring) -> String {
        String(text.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }

    /// Where the authority starts: after `scheme://`.
    private static func authorityStart(_ url: String) -> String.Index {
        var i = url.startIndex
        while i < url.endIndex {
            if url[i...].hasPrefix("://") { return url.index(i, offsetBy: 3) }
            i = url.index(after: i)
        }
        return url.startIndex
    }

    private static func hasPort(_ url: String) -> Bool {
        var rest = url[authorityStart(url)...]
        if let at = rest.lastIndex(of: "@") { rest = rest[rest.index(after: at)...] }
        if let slash = rest.firstIndex(of: "/") { rest = rest[..<slash] }
        if rest.hasPrefix("[") { return rest.contains("]:") }
        return rest.contains(":")
    }

    private static func withPort(_ url: String, _ port: Int) -> String {
        guard let slash = url[authorityStart(url)...].firstIndex(of: "/") else { return url + ":\(port)" }
        return String(url[..<slash]) + ":\(port)" + String(url[slash...])
    }
}
