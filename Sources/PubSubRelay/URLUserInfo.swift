/// The `user[:password]` before the `@` of a URL's authority, percent-decoded (`BLIPURL`, `CouchDBURL`).
struct URLUserInfo: Sendable, Equatable {
    var user: String
    var password: String?

    init(_ text: Substring) {
        if let colon = text.firstIndex(of: ":") {
            user = Self.percentDecoded(text[..<colon])
            password = Self.percentDecoded(text[text.index(after: colon)...])
        } else {
            user = Self.percentDecoded(text)
        }
    }

    /// Splits `[user[:password]@]host[:port]` at its last `@`.
    static func split(authority: Substring) -> (userInfo: URLUserInfo?, hostAndPort: Substring) {
        guard let at = authority.lastIndex(of: "@") else { return (nil, authority) }
        return (URLUserInfo(authority[..<at]), authority[authority.index(after: at)...])
    }

    /// `%XX` decoded; a `%` without two hex digits after it stays as it is.
    static func percentDecoded(_ text: Substring) -> String {
        var out: [UInt8] = []
        var bytes = Array(text.utf8)[...]
        while let byte = bytes.popFirst() {
            if byte == UInt8(ascii: "%"), bytes.count >= 2,
               let value = UInt8(String(decoding: bytes.prefix(2), as: UTF8.self), radix: 16)
            {
                out.append(value)
                bytes = bytes.dropFirst(2)
            } else {
                out.append(byte)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
