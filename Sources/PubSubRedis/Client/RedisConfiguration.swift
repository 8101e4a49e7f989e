import Bayeux
import NIOCore

/// Where Redis is and how to talk to it, usually read from a `redis[s]://[[user]:password@]host[:port][/db]` URL.
public struct RedisConfiguration: Sendable, Hashable {
    public var host: String
    public var port: Int
    /// TLS (`rediss://`): the server's certificate is checked against the system trust store, or `caFile`.
    public var tls: Bool
    /// PEM file of the certificate authorities to trust instead of the system's.
    public var caFile: String?
    /// The name the server's certificate must carry, when it is not the host connected to.
    public var tlsServerName: String?
    public var username: String?
    public var password: String?
    public var database: Int
    /// A reply slower than this closes the connection (its pipeline can no longer be trusted) and reconnects.
    public var commandTimeout: TimeAmount
    public var connectTimeout: TimeAmount
    /// Reconnect delays grow from the first to the last, doubling, with jitter.
    public var backoff: (first: TimeAmount, last: TimeAmount)
    public var decoderLimits: RESPDecoder.Limits

    public init(
        host: String = "127.0.0.1", port: Int = 6379, username: String? = nil, password: String? = nil,
        database: Int = 0, commandTimeout: TimeAmount = .seconds(5), connectTimeout: TimeAmount = .seconds(2),
        backoff: (first: TimeAmount, last: TimeAmount) = (.milliseconds(50), .seconds(2)),
        decoderLimits: RESPDecoder.Limits = .init(), tls: Bool = false, caFile: String? = nil,
        tlsServerName: String? = nil
    ) {
        self.host = host
        self.port = port
        self.tls = tls
        self.caFile = caFile
        self.tlsServerName = tlsServerName
        self.username = username
        self.password = password
        self.database = database
        self.commandTimeout = commandTimeout
        self.connectTimeout = connectTimeout
        self.backoff = backoff
        self.decoderLimits = decoderLimits
    }

    public struct URLError: Error, CustomStringConvertible, Hashable {
        public var url: String
        public var reason: String
        public var description: String { "invalid Redis URL '\(url)': \(reason)" }
    }

    /// Parses `redis[s]://[[user]:password@]host[:port][/db]`; user and password are percent-decoded;
    /// `rediss://` is TLS.
    public init(url: String) throws {
        let scheme = url.hasPrefix("rediss://") ? "rediss://" : "redis://"
        func fail(_ reason: String) -> URLError {
            // Never echo a password back.
            URLError(
                url: url.contains("@") ? scheme + "…@" + (url.split(separator: "@").last.map(String.init) ?? "") : url,
                reason: reason)
        }
        guard url.hasPrefix(scheme) else { throw fail("it must start with redis:// or rediss://") }
        var rest = Substring(url.dropFirst(scheme.count))
        if let q = rest.firstIndex(where: { $0 == "?" || $0 == "#" }) { rest = rest[..<q] }
        self.init()
        tls = scheme == "rediss://"
        var authority = rest
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            let db = rest[rest.index(after: slash)...]
            if !db.isEmpty {
                guard let n = Int(db), n >= 0, n < 1 << 16 else { throw fail("the database must be a number") }
                database = n
            }
        }
        let parts: URLAuthority
        do {
            parts = try URLAuthority(authority)
        } catch {
            switch error {
            case .badPort: throw fail("bad port")
            case .unclosedBracket, .junkAfterBracket: throw fail("bad host")
            }
        }
        func decoded(_ text: String) throws -> String {
            do { return try PercentDecoding.decode(text) } catch { throw fail("bad percent escape") }
        }
        if let user = parts.user {
            if let secret = parts.password {
                username = user.isEmpty ? nil : try decoded(user)
                password = try decoded(secret)
            } else if !user.isEmpty {
                // `redis://secret@host` is how some tools write a password alone.
                password = try decoded(user)
            }
        }
        host = parts.host
        if let port = parts.port { self.port = port }
        if host.isEmpty { host = "127.0.0.1" }
    }

    /// The URL without the password, for logs.
    public var redacted: String {
        let auth = password == nil ? "" : (username ?? "") + ":***@"
        let shownHost = host.contains(":") ? "[\(host)]" : host
        return (tls ? "rediss://" : "redis://") + "\(auth)\(shownHost):\(port)/\(database)"
    }

    public static func == (a: Self, b: Self) -> Bool {
        a.host == b.host && a.port == b.port && a.username == b.username && a.password == b.password
            && a.database == b.database && a.commandTimeout == b.commandTimeout
            && a.connectTimeout == b.connectTimeout && a.backoff.first == b.backoff.first
            && a.backoff.last == b.backoff.last && a.decoderLimits == b.decoderLimits && a.tls == b.tls
            && a.caFile == b.caFile && a.tlsServerName == b.tlsServerName
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(host)
        hasher.combine(port)
        hasher.combine(database)
    }
}
