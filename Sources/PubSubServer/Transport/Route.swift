/// Where an HTTP request path goes, following Faye's rule: a request belongs to the broker when its path
/// matches `^<mount>(/[^/]*)*(\.[^.]+)?$`.
enum Route: Equatable {
    case bayeux
    /// `<mount>/<clientId>` as used by EventSource.
    case bayeuxWithSuffix(String)
    /// `<mount>.js`, `<mount>/client.js` and other static names.
    case staticFile(String)
    case health
    /// `/readyz`: accepting and the engine ready.
    case ready
    /// `/metrics`: Prometheus text.
    case metrics
    /// `/api/<call>`: the server API (`ServerAPI`).
    case api(String)
    /// `/admin`: the dashboard page.
    case admin
    case notFound

    init(path rawPath: String, mount: String) {
        let path =
            rawPath.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init)
            ?? rawPath
        if path == "/healthz" {
            self = .health
            return
        }
        if path == "/readyz" {
            self = .ready
            return
        }
        if path == "/metrics" {
            self = .metrics
            return
        }
        if path.hasPrefix("/api/") {
            self = .api(String(path.dropFirst(5)))
            return
        }
        if path == "/admin" || path == "/admin/" {
            self = .admin
            return
        }
        if path == mount || path == mount + "/" || (mount.isEmpty && path == "/") {
            self = .bayeux
            return
        }
        if !mount.isEmpty, path == mount + ".js" || path == mount + ".map" {
            self = .staticFile(String(path.dropFirst(mount.count)))
            return
        }
        guard path.hasPrefix(mount + "/") else {
            self = .notFound
            return
        }
        let rest = path.dropFirst(mount.count + 1)
        if rest.hasSuffix(".js") || rest.hasSuffix(".map") {
            self = .staticFile(String(rest))
        } else {
            self = .bayeuxWithSuffix(String(rest.split(separator: "/").last ?? ""))
        }
    }
}

/// `application/x-www-form-urlencoded` and query strings: `+` is a space, `%XX` a byte. Values stay bytes, so
/// invalid UTF-8 is caught by the JSON parser with a clear error rather than replaced.
enum FormData {
    static func value(of name: String, in encoded: some Collection<UInt8>) -> [UInt8]? {
        let key = Array(name.utf8)
        for pair in encoded.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: true) {
            let parts = pair.split(separator: UInt8(ascii: "="), maxSplits: 1, omittingEmptySubsequences: false)
            if decode(parts[0]) == key {
                return parts.count > 1 ? decode(parts[1]) : []
            }
        }
        return nil
    }

    static func decode(_ bytes: some Collection<UInt8>) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var iterator = Array(bytes)[...]
        while let b = iterator.popFirst() {
            if b == UInt8(ascii: "+") {
                out.append(UInt8(ascii: " "))
            } else if b == UInt8(ascii: "%"), iterator.count >= 2,
                let hi = hexValue(iterator[iterator.startIndex]),
                let lo = hexValue(iterator[iterator.startIndex + 1])
            {
                out.append(hi << 4 | lo)
                iterator = iterator.dropFirst(2)
            } else {
                out.append(b)
            }
        }
        return out
    }

    static func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return b - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return b - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return b - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

/// JSON-P callback names Faye accepts: `^[a-z_$][a-z0-9_$]*(\.[a-z_$][a-z0-9_$]*)*$`, case-insensitive.
enum JSONPCallback {
    static func isValid(_ name: [UInt8]) -> Bool {
        guard !name.isEmpty else { return false }
        var atSegmentStart = true
        for b in name {
            let lower = b | 0x20
            let letter = lower >= UInt8(ascii: "a") && lower <= UInt8(ascii: "z")
            let digit = b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9")
            let extra = b == UInt8(ascii: "_") || b == UInt8(ascii: "$")
            if b == UInt8(ascii: ".") {
                if atSegmentStart { return false }
                atSegmentStart = true
                continue
            }
            if atSegmentStart {
                guard letter || extra else { return false }
                atSegmentStart = false
            } else {
                guard letter || digit || extra else { return false }
            }
        }
        return !atSegmentStart
    }
}
