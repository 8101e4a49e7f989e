import Bayeux

/// A database URL `http[s]://[user[:password]@]host[:port]/db` (or a Sync Gateway keyspace `/db.scope.collection`).
public struct CouchDBURL: Sendable, Equatable {
    public var tls: Bool
    /// The host as written in the URL (an IPv6 address keeps its brackets).
    public var host: String
    public var port: Int?
    public var user: String?
    public var password: String?
    /// The path as written (percent-encoded), without a trailing slash: `/db`, `/a%2Fb`, `/db.scope.collection`.
    public var path: String
    /// The database name, percent-decoded: the path's last segment.
    public var database: String

    public init(_ text: String) throws {
        let scheme: Substring
        var rest: Substring
        if text.hasPrefix("http://") {
            (scheme, rest) = ("http", text.dropFirst(7))
        } else if text.hasPrefix("https://") {
            (scheme, rest) = ("https", text.dropFirst(8))
        } else {
            throw RelayError(
                .invalidURL, "--db-url must start with http:// or https:// (got \(BLIPURL.redacted(text)))")
        }
        tls = scheme == "https"
        if rest.contains("?") || rest.contains("#") {
            throw RelayError(
                .invalidURL, "--db-url takes no query or fragment: http[s]://[user:password@]host[:port]/db")
        }
        guard let slash = rest.firstIndex(of: "/") else {
            throw RelayError(.invalidURL, "--db-url needs the database: http[s]://[user:password@]host[:port]/db")
        }
        let authority: URLAuthority
        do throws(URLAuthority.Failure) {
            authority = try URLAuthority(rest[..<slash])
        } catch {
            switch error {
            case .unclosedBracket: throw RelayError(.invalidURL, "--db-url: unclosed [ in the host")
            case .junkAfterBracket(let junk): throw RelayError(.invalidURL, "--db-url: bad host …]\(junk)")
            case .badPort(let port): throw RelayError(.invalidURL, "--db-url: bad port \(port)")
            }
        }
        var path = String(rest[slash...])
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        rest = ""
        user = authority.user.map(PercentDecoding.decodeLeniently)
        password = authority.password.map(PercentDecoding.decodeLeniently)
        host = authority.hostInURL
        port = authority.port
        guard !host.isEmpty, !host.contains(" ") else { throw RelayError(.invalidURL, "--db-url needs a host") }
        let segments = path.split(separator: "/")
        guard let last = segments.last, !last.isEmpty, !last.hasPrefix("_") else {
            throw RelayError(
                .invalidURL, "--db-url needs the database as its last path segment: http[s]://host[:port]/db")
        }
        self.path = path
        database = PercentDecoding.decodeLeniently(last)
    }

    /// `scheme://host[:port]/path`, without credentials.
    public var base: String {
        (tls ? "https://" : "http://") + host + (port.map { ":\($0)" } ?? "") + path
    }

    /// What names the feed in the source id: `host[:port]/path`.
    public var feedName: String { host + (port.map { ":\($0)" } ?? "") + path }

    /// The collection path: the database, split into `db`, `scope`, `collection` for a Sync Gateway keyspace.
    public var collection: [String] {
        database.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
    }

    /// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
    static func queryEncode(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.unicodeScalars.append(UnicodeScalar(byte))
            default:
                let hex = String(byte, radix: 16, uppercase: true)
                out += "%" + (byte < 16 ? "0" : "") + hex
            }
        }
        return out
    }
}
