import Bayeux

/// A Sync Gateway database URL for BLIP, `ws[s]://[user:password@]host[:port]/db` (a trailing `/_blipsync` is
/// accepted); user and password are percent-decoded and sent as Basic authorization, never logged.
public struct BLIPURL: Sendable, Equatable, CustomStringConvertible {
    public var secure: Bool
    public var host: String
    public var port: Int?
    /// The database or keyspace (`db`, `db.scope.collection`).
    public var database: String
    public var username: String?
    public var password: String?

    public init(_ text: String, username: String? = nil, password: String? = nil) throws {
        let rest: Substring
        if text.hasPrefix("ws://") {
            secure = false
            rest = text.dropFirst(5)
        } else if text.hasPrefix("wss://") {
            secure = true
            rest = text.dropFirst(6)
        } else {
            throw RelayError(.invalidURL, "\(Self.redacted(text)): expected ws://host:4984/db or wss://…")
        }
        let authorityEnd = rest.firstIndex(of: "/") ?? rest.endIndex
        let authority: URLAuthority
        do throws(URLAuthority.Failure) {
            authority = try URLAuthority(rest[..<authorityEnd])
        } catch {
            switch error {
            case .badPort: throw RelayError(.invalidURL, "\(Self.redacted(text)): bad port")
            case .unclosedBracket, .junkAfterBracket: throw RelayError(.invalidURL, "\(Self.redacted(text)): bad host")
            }
        }
        var path = rest[authorityEnd...].drop { $0 == "/" }
        self.username = username ?? authority.user.map(PercentDecoding.decodeLeniently)
        self.password = password ?? authority.password.map(PercentDecoding.decodeLeniently)
        host = authority.hostInURL
        port = authority.port
        guard !authority.host.isEmpty else { throw RelayError(.invalidURL, "\(Self.redacted(text)): no host") }
        if path.hasSuffix("/_blipsync") { path = path.dropLast("/_blipsync".count) }
        while path.hasSuffix("/") { path = path.dropLast() }
        guard !path.isEmpty, !path.contains("/"), !path.contains("?"), !path.contains("#") else {
            throw RelayError(
                .invalidURL, "\(Self.redacted(text)): expected one database name in the path, e.g. ws://host:4984/db")
        }
        database = String(path)
    }

    /// `host[:port]`.
    public var hostAndPort: String { port.map { "\(host):\($0)" } ?? host }

    /// The WebSocket endpoint, `ws[s]://host:port/db/_blipsync`.
    public var endpoint: String { (secure ? "wss://" : "ws://") + hostAndPort + "/" + database + "/_blipsync" }

    public var description: String { (secure ? "wss://" : "ws://") + hostAndPort + "/" + database }

    /// `Basic base64(user:password)`, when a user is given.
    public var basicAuthorization: String? {
        guard let username else { return nil }
        return "Basic " + Self.base64(Array((username + ":" + (password ?? "")).utf8))
    }

    static func redacted(_ text: String) -> String {
        let parts = text.split(separator: "/", maxSplits: 3, omittingEmptySubsequences: false)
        guard parts.count >= 3, let at = parts[2].lastIndex(of: "@") else { return text }
        var redacted = parts
        redacted[2] = "…" + parts[2][at...]
        return redacted.joined(separator: "/")
    }

    static func base64(_ bytes: [UInt8]) -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        var output: [UInt8] = []
        var index = 0
        while index < bytes.count {
            let chunk = bytes[index..<min(index + 3, bytes.count)]
            let value = chunk.enumerated().reduce(UInt32(0)) { $0 | UInt32($1.element) << (16 - 8 * UInt32($1.offset)) }
            for position in 0..<4 {
                output.append(
                    position <= chunk.count
                        ? alphabet[Int((value >> (18 - 6 * UInt32(position))) & 0x3F)]
                        : UInt8(ascii: "="))
            }
            index += 3
        }
        return String(decoding: output, as: UTF8.self)
    }
}
