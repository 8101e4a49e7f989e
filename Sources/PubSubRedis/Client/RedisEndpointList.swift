/// A comma-separated list of Redis servers, as `--redis-sentinels` and `--redis-cluster` take it: `host[:port]`
/// (`[v6]:port` for IPv6) or `redis[s]://[[user]:password@]host[:port]` for TLS or a password, which every
/// entry must then say the same way.
public enum RedisEndpointList {
    public struct ParseError: Error, CustomStringConvertible, Hashable {
        public var description: String
    }

    /// The endpoints, and how to talk to them (scheme, user, password; host and port are those of the first).
    /// `noun` names an entry in messages ("sentinel", "cluster node").
    public static func parse(_ list: String, defaultPort: Int, noun: String) throws -> (
        [RedisEndpoint], RedisConfiguration
    ) {
        var endpoints: [RedisEndpoint] = []
        var connection: RedisConfiguration?
        for raw in list.split(separator: ",") {
            let entry = trimmed(raw)
            guard !entry.isEmpty else { continue }
            var url = entry.contains("://") ? entry : "redis://" + entry
            if !hasPort(url) { url = withPort(url, defaultPort) }
            let parsed: RedisConfiguration
            do {
                parsed = try RedisConfiguration(url: url)
            } catch {
                throw ParseError(description: "invalid \(noun) '\(entry)': \(error)")
            }
            var shared = parsed
            shared.host = ""
            shared.port = 0
            if let connection, connection != shared {
                throw ParseError(description: "every \(noun) must use the same scheme and password")
            }
            connection = shared
            endpoints.append(RedisEndpoint(host: parsed.host, port: parsed.port))
        }
        guard var connection, let first = endpoints.first else {
            throw ParseError(description: "no \(noun) given (host:port,host:port)")
        }
        connection.host = first.host
        connection.port = first.port
        return (endpoints, connection)
    }

    static func trimmed(_ text: Substring) -> String {
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
