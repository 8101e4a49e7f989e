import NIOHTTP1

/// Which web origins may use the broker from a browser (`--allowed-origins`).
///
/// A request or WebSocket upgrade without `Origin` (a script, a server, a mobile app) is always allowed, and so
/// is a same-origin one (its `Origin` names the `Host` it was sent to). Otherwise the origin must match a
/// pattern: `https://app.example.com`, `https://*.example.com` (any subdomain; `*` never spans a `/` or a `:`),
/// `http://localhost:*` (any port). With no patterns (the default, as Faye) every origin is allowed.
///
/// JSON-P callback-polling (`GET ?jsonp=`) is a script include: browsers send it no `Origin`, so it cannot be
/// protected by origin; `--disable-callback-polling` turns it off.
public struct OriginPolicy: Sendable, Equatable {
    /// nil: any origin.
    public var patterns: [String]?

    public init(patterns: [String]? = nil) { self.patterns = patterns?.map { $0.lowercased() } }

    public struct InvalidPattern: Error, CustomStringConvertible {
        public var pattern: String
        public var description: String {
            "\(pattern): not an origin (scheme://host[:port], with * for any subdomain or port)"
        }
    }

    /// Parses the flag's comma-separated list; throws on a pattern that could never match an origin.
    public static func parse(_ list: String) throws -> OriginPolicy {
        let patterns = list.split(separator: ",").map { $0.trimmingCharacters(in: " \t") }.filter { !$0.isEmpty }
        for pattern in patterns {
            let parts = pattern.split(separator: "://", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, ["http", "https"].contains(parts[0].lowercased()), !parts[1].isEmpty,
                !parts[1].contains("/")
            else { throw InvalidPattern(pattern: pattern) }
        }
        return OriginPolicy(patterns: patterns)
    }

    /// Whether a request or upgrade with these headers may proceed.
    public func allows(_ headers: HTTPHeaders) -> Bool {
        guard patterns != nil else { return true }
        // Every Origin header must pass (a browser sends one; a second one must not smuggle the first past).
        let host = headers.first(name: "host")?.lowercased()
        return headers["origin"].allSatisfy { origin in
            (host != nil && Self.authority(of: origin) == host) || allows(origin: origin)
        }
    }

    public func allows(origin: String) -> Bool {
        guard let patterns else { return true }
        let origin = origin.lowercased()
        return patterns.contains { Self.glob($0[...], origin[...]) }
    }

    /// `host[:port]` of `scheme://host[:port]`.
    static func authority(of origin: String) -> String? {
        let parts = origin.split(separator: "://", maxSplits: 1, omittingEmptySubsequences: false)
        return parts.count == 2 ? parts[1].lowercased() : nil
    }

    /// `*` matches one or more characters other than `/` and `:`.
    static func glob(_ pattern: Substring, _ text: Substring) -> Bool {
        guard let first = pattern.first else { return text.isEmpty }
        if first == "*" {
            var rest = text
            while let c = rest.first, c != "/", c != ":" {
                rest = rest.dropFirst()
                if glob(pattern.dropFirst(), rest) { return true }
            }
            return false
        }
        guard text.first == first else { return false }
        return glob(pattern.dropFirst(), text.dropFirst())
    }
}

extension StringProtocol {
    fileprivate func trimmingCharacters(in set: String) -> String {
        var s = Substring(self)
        while let c = s.first, set.contains(c) { s = s.dropFirst() }
        while let c = s.last, set.contains(c) { s = s.dropLast() }
        return String(s)
    }
}
