import Bayeux

/// The address of a Bayeux endpoint: `http[s]://host:port/path` (long-polling) or `ws[s]://host:port/path`
/// (WebSocket); either form names the same endpoint, the scheme only picks the default transport (and TLS).
public struct BayeuxURL: Sendable, Hashable, CustomStringConvertible {
    public var secure: Bool
    public var host: String
    public var port: Int
    /// The path with the query, e.g. `/faye`; `/` when the URL has none.
    public var path: String
    /// True when the URL was written with `ws:` or `wss:`.
    public var prefersWebSocket: Bool

    public init(_ string: String) throws(BayeuxClientError) {
        func invalid(_ why: String) -> BayeuxClientError {
            BayeuxClientError(.invalidURL, "invalid URL '\(string)': \(why)")
        }
        guard let schemeEnd = string.firstRange(of: "://") else {
            throw invalid("expected http://HOST[:PORT]/PATH")
        }
        let scheme = string[..<schemeEnd.lowerBound].lowercased()
        switch scheme {
        case "http": (secure, prefersWebSocket) = (false, false)
        case "ws": (secure, prefersWebSocket) = (false, true)
        case "https": (secure, prefersWebSocket) = (true, false)
        case "wss": (secure, prefersWebSocket) = (true, true)
        default: throw invalid("unknown scheme '\(scheme)'")
        }
        let rest = string[schemeEnd.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        let authority: URLAuthority
        do throws(URLAuthority.Failure) {
            authority = try URLAuthority(rest[..<authorityEnd])
        } catch {
            switch error {
            case .unclosedBracket: throw invalid("unclosed '[' in host")
            case .junkAfterBracket, .badPort: throw invalid("bad port")
            }
        }
        var path = String(rest[authorityEnd...])
        if let hash = path.firstIndex(of: "#") { path = String(path[..<hash]) }
        if path.isEmpty || path.hasPrefix("?") { path = "/" + path }
        self.path = path
        host = authority.host
        port = authority.port ?? (secure ? 443 : 80)
        guard !host.isEmpty else { throw invalid("no host") }
    }

    /// The `Host` header value.
    var hostHeader: String {
        let h = host.contains(":") ? "[\(host)]" : host
        return port == (secure ? 443 : 80) ? h : "\(h):\(port)"
    }

    /// The name sent in TLS's SNI and checked against the certificate; nil for an IP address (the certificate is
    /// then checked against the address).
    var tlsServerName: String? {
        let isIPv4 =
            host.split(separator: ".", omittingEmptySubsequences: false).count == 4
            && host.allSatisfy { $0 == "." || $0.isNumber }
        return host.contains(":") || isIPv4 ? nil : host
    }

    public var description: String {
        "\(prefersWebSocket ? "ws" : "http")\(secure ? "s" : "")://\(hostHeader)\(path)"
    }
}
