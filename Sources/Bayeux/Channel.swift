/// Channel names and subscription patterns, with Faye's grammar (`grammar.rb`):
/// a segment is one or more of `[A-Za-z0-9]` and `- _ ! ~ ( ) $ @`; a name is `/` segment (`/` segment)*;
/// a pattern ends in a whole last segment `*` (one level) or `**` (any depth).
public enum Channel {
    public static let handshake = "/meta/handshake"
    public static let connect = "/meta/connect"
    public static let subscribe = "/meta/subscribe"
    public static let unsubscribe = "/meta/unsubscribe"
    public static let disconnect = "/meta/disconnect"

    @inline(__always)
    static func isSegmentByte(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        case UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "!"), UInt8(ascii: "~"), UInt8(ascii: "("),
            UInt8(ascii: ")"), UInt8(ascii: "$"), UInt8(ascii: "@"):
            return true
        default:
            return false
        }
    }

    public enum Kind: Sendable, Equatable {
        case name
        case singleWildcard  // "/a/*"
        case deepWildcard  // "/a/**"
    }

    /// Classifies `string`, or returns nil when it is neither a valid name nor a valid pattern.
    public static func kind(of string: String) -> Kind? {
        var utf8 = string.utf8
        if let result = utf8.withContiguousStorageIfAvailable({ classify($0) }) { return result }
        var copy = string
        copy.makeContiguousUTF8()
        utf8 = copy.utf8
        return utf8.withContiguousStorageIfAvailable({ classify($0) }) ?? nil
    }

    private static func classify(_ bytes: UnsafeBufferPointer<UInt8>) -> Kind? {
        guard bytes.count >= 2, bytes[0] == UInt8(ascii: "/") else { return nil }
        var i = 1
        while true {
            // At the start of a segment.
            let segmentStart = i
            var stars = 0
            var plain = 0
            while i < bytes.count, bytes[i] != UInt8(ascii: "/") {
                if bytes[i] == UInt8(ascii: "*") {
                    stars += 1
                } else if isSegmentByte(bytes[i]) {
                    plain += 1
                } else {
                    return nil
                }
                i += 1
            }
            let length = i - segmentStart
            guard length > 0 else { return nil }
            let last = i == bytes.count
            if stars > 0 {
                guard plain == 0, last, stars <= 2 else { return nil }
                return stars == 1 ? .singleWildcard : .deepWildcard
            }
            if last { return .name }
            i += 1  // skip "/"
        }
    }

    public static func isValidName(_ string: String) -> Bool { kind(of: string) == .name }

    public static func isValidNameOrPattern(_ string: String) -> Bool { kind(of: string) != nil }

    /// The first segment is compared as parsed, so `/metadata` is neither meta nor service.
    public static func isMeta(_ string: String) -> Bool { firstSegment(of: string) == "meta" }

    public static func isService(_ string: String) -> Bool { firstSegment(of: string) == "service" }

    /// Whether a remote client may subscribe: valid, and not under `/meta` or `/service`.
    public static func isSubscribable(_ string: String) -> Bool {
        isValidNameOrPattern(string) && !isMeta(string) && !isService(string)
    }

    static func firstSegment(of string: String) -> Substring? {
        guard string.hasPrefix("/") else { return nil }
        let rest = string.dropFirst()
        if let slash = rest.firstIndex(of: "/") { return rest[..<slash] }
        return rest
    }

    /// Every subscription key that receives a publish on `name`, as Faye's `Channel.expand`:
    /// for `/a/b/c` that is `/a/b/c`, `/**`, `/a/**`, `/a/b/**`, `/a/b/*`.
    public static func expand(_ name: String) -> [String] {
        // One array of the size it needs (a publish makes one).
        var inner = 0
        for byte in name.utf8.dropFirst() where byte == UInt8(ascii: "/") { inner += 1 }
        var result: [String] = []
        result.reserveCapacity(inner + 3)
        result.append(name)
        result.append("/**")
        var index = name.index(after: name.startIndex)
        var prefix: Substring = ""
        while let slash = name[index...].firstIndex(of: "/") {
            prefix = name[..<slash]
            result.append(prefix + "/**")
            index = name.index(after: slash)
        }
        result.append(prefix + "/*")
        return result
    }

    /// Whether a subscription `pattern` (a name or a wildcard pattern) matches the channel `name`.
    public static func matches(pattern: String, name: String) -> Bool {
        if pattern == name { return true }
        if pattern == "/**" { return true }
        if pattern.hasSuffix("/**") {
            let prefix = pattern.dropLast(2)
            return name.count > prefix.count && name.hasPrefix(prefix)
        }
        if pattern.hasSuffix("/*") {
            let prefix = pattern.dropLast(1)
            guard name.hasPrefix(prefix) else { return false }
            let rest = name.dropFirst(prefix.count)
            return !rest.isEmpty && !rest.contains("/")
        }
        return false
    }
}
