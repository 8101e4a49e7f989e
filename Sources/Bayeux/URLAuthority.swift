/// The authority of a URL, `[user[:password]@]host[:port]` (RFC 3986 §3.2), split the same way for every URL the
/// product reads: the broker URL of the client, the relay's CouchDB, Sync Gateway and PostgreSQL URLs (it lives in
/// `Bayeux`, which every module imports). Nothing is decoded: `user` and `password` are as written (decode them
/// with `PercentDecoding`); the caller decides what a missing host or port means and words its own errors.
public struct URLAuthority: Sendable, Hashable {
    /// The user info up to its first `:`; nil without `@`.
    public var user: String?
    /// The user info after its first `:`; nil without one.
    public var password: String?
    /// The host; an IPv6 literal without its brackets. Empty when none is written.
    public var host: String
    /// Whether the host was written in brackets (an IPv6 literal, `[::1]`).
    public var isBracketed: Bool
    /// The port, in 1...65535; nil when none is written.
    public var port: Int?

    public enum Failure: Error, Sendable, Hashable {
        /// A `[` without its `]`.
        case unclosedBracket
        /// Something other than `:port` after the `]` of an IPv6 literal.
        case junkAfterBracket(String)
        /// A port that is not a number in 1...65535 (an empty one too: `host:`).
        case badPort(String)
    }

    /// Splits `authority` (the text between `scheme://` and the path) at its last `@`, then host and port.
    public init(_ authority: some StringProtocol) throws(Failure) {
        var rest = Substring(authority)
        if let at = rest.lastIndex(of: "@") {
            let userInfo = rest[..<at]
            rest = rest[rest.index(after: at)...]
            if let colon = userInfo.firstIndex(of: ":") {
                user = String(userInfo[..<colon])
                password = String(userInfo[userInfo.index(after: colon)...])
            } else {
                user = String(userInfo)
            }
        }
        var portText: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { throw .unclosedBracket }
            host = String(rest[rest.index(after: rest.startIndex)..<close])
            isBracketed = true
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw .junkAfterBracket(String(after)) }
                portText = after.dropFirst()
            }
        } else if let colon = rest.lastIndex(of: ":") {
            host = String(rest[..<colon])
            isBracketed = false
            portText = rest[rest.index(after: colon)...]
        } else {
            host = String(rest)
            isBracketed = false
        }
        if let portText {
            guard portText.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
                let number = Int(portText), (1...65535).contains(number)
            else { throw .badPort(String(portText)) }
            port = number
        }
    }

    /// The host as written in a URL: an IPv6 literal in its brackets.
    public var hostInURL: String { isBracketed ? "[" + host + "]" : host }
}

/// `%XX` decoding of URL parts (user, password, a path segment, a query value).
public enum PercentDecoding {
    public enum Failure: Error, Sendable, Hashable {
        /// A `%` without two hex digits after it.
        case badEscape
        /// The decoded bytes are not UTF-8.
        case notUTF8
    }

    /// Throws on a `%` without two hex digits after it, or on decoded bytes that are not UTF-8.
    public static func decode(_ text: some StringProtocol) throws(Failure) -> String {
        guard let bytes = decodedBytes(text, lenient: false) else { throw .badEscape }
        guard let string = String(validating: bytes, as: UTF8.self) else { throw .notUTF8 }
        return string
    }

    /// Never fails: a `%` without two hex digits after it stays as it is; bytes that are not UTF-8 become U+FFFD.
    public static func decodeLeniently(_ text: some StringProtocol) -> String {
        String(decoding: decodedBytes(text, lenient: true)!, as: UTF8.self)
    }

    private static func decodedBytes(_ text: some StringProtocol, lenient: Bool) -> [UInt8]? {
        let input = Array(text.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(input.count)
        var i = 0
        while i < input.count {
            let byte = input[i]
            if byte == UInt8(ascii: "%") {
                if i + 2 < input.count, let high = hexValue(input[i + 1]), let low = hexValue(input[i + 2]) {
                    out.append(high << 4 | low)
                    i += 3
                    continue
                }
                if !lenient { return nil }
            }
            out.append(byte)
            i += 1
        }
        return out
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
