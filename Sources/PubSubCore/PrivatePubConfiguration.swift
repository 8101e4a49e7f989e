/// One environment's section of PrivatePub's `config/private_pub.yml`:
///
///     production:
///       server: "https://example.com/faye"
///       secret_token: "6c1e..."
///       signature_expiration: 3600 # one hour
///
/// The file is read as PrivatePub reads it (`YAML.load_file(file)[environment]`), with a small YAML reader that
/// knows exactly the shapes these files take: top-level sections holding `key: value` lines, plain, single- or
/// double-quoted scalars, comments, `---`, and shared defaults through an anchor and a merge key
/// (`defaults: &defaults` … `<<: *defaults`). Anything else is refused with the line number rather than
/// guessed at.
public struct PrivatePubConfiguration: Sendable, Equatable {
    public var server: String?
    public var secretToken: String?
    /// Seconds; nil means signatures never expire.
    public var signatureExpiration: Double?

    public init(server: String? = nil, secretToken: String? = nil, signatureExpiration: Double? = nil) {
        self.server = server
        self.secretToken = secretToken
        self.signatureExpiration = signatureExpiration
    }

    /// Reads the section named `environment` of the YAML `text`; `file` only names the file in errors.
    public static func parse(_ text: String, environment: String, file: String = "private_pub.yml") throws
        -> PrivatePubConfiguration
    {
        let sections = try FlatYAML.parse(text, file: file)
        guard let section = sections[environment] else {
            throw PrivatePubConfigurationError("The \(environment) environment does not exist in \(file)")
        }
        var configuration = PrivatePubConfiguration()
        for (key, value) in section {
            switch key {
            case "server":
                configuration.server = value.text
            case "secret_token":
                configuration.secretToken = value.text
            case "signature_expiration":
                guard let text = value.text else { break }
                guard let seconds = Double(text), seconds.isFinite, seconds >= 0 else {
                    throw PrivatePubConfigurationError(
                        "\(file): signature_expiration in \(environment) must be a number of seconds, not '\(text)'")
                }
                configuration.signatureExpiration = seconds
            default:
                break  // PrivatePub ignores other keys too.
            }
        }
        return configuration
    }
}

public struct PrivatePubConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The two-level YAML subset of PrivatePub's configuration files.
enum FlatYAML {
    struct Scalar: Equatable {
        /// nil for YAML null (`~`, `null`, nothing).
        var text: String?
    }

    static func parse(_ text: String, file: String) throws -> [String: [(String, Scalar)]] {
        var sections: [String: [(String, Scalar)]] = [:]
        var anchors: [String: String] = [:]  // anchor name → section name
        var current: String?
        var currentIndent: Int?
        var merges: [String: [String]] = [:]  // section → anchors merged into it, in order
        func fail(_ line: Int, _ why: String) -> PrivatePubConfigurationError {
            PrivatePubConfigurationError("\(file):\(line): \(why)")
        }
        var lineNumber = 0
        // "\r\n" is one Character in Swift, so it is named as a separator of its own.
        let lines = text.split(omittingEmptySubsequences: false) { $0 == "\n" || $0 == "\r\n" || $0 == "\r" }
        for rawLine in lines {
            lineNumber += 1
            var line = Substring(rawLine)
            if lineNumber == 1, line.hasPrefix("\u{FEFF}") { line = line.dropFirst() }
            let content = stripComment(line)
            if content.allSatisfy({ $0 == " " }) { continue }
            if content.hasPrefix("\t") || content.drop(while: { $0 == " " }).hasPrefix("\t") {
                throw fail(lineNumber, "tabs are not allowed for indentation in YAML")
            }
            if content == "---" || content.hasPrefix("--- ") || content.hasPrefix("%") { continue }
            if content == "..." { break }
            let indent = content.prefix(while: { $0 == " " }).count
            let body = content.dropFirst(indent)
            if body.hasPrefix("- ") || body == "-" {
                throw fail(lineNumber, "lists are not part of a PrivatePub configuration")
            }
            guard let (key, rest) = splitKey(body) else {
                throw fail(lineNumber, "expected 'key: value'")
            }
            if indent == 0 {
                current = nil
                currentIndent = nil
                if rest.isEmpty {
                    current = key
                    sections[key] = sections[key] ?? []
                } else if rest.hasPrefix("&") {
                    let name = String(rest.dropFirst())
                    guard !name.isEmpty, !name.contains(" ") else { throw fail(lineNumber, "bad anchor") }
                    anchors[name] = key
                    current = key
                    sections[key] = sections[key] ?? []
                } else if rest.hasPrefix("{") || rest.hasPrefix("[") {
                    throw fail(lineNumber, "flow collections are not supported; write one 'key: value' per line")
                }
                // A top-level scalar is not an environment; it is ignored, as PrivatePub would never read it.
                continue
            }
            guard let section = current else {
                throw fail(lineNumber, "indented line outside of an environment section")
            }
            if let expected = currentIndent, indent != expected {
                throw fail(lineNumber, "nested mappings are not part of a PrivatePub configuration")
            }
            currentIndent = indent
            if key == "<<" {
                guard rest.hasPrefix("*") else { throw fail(lineNumber, "merge key needs an alias such as *defaults") }
                merges[section, default: []].append(String(rest.dropFirst()))
                continue
            }
            if rest.hasPrefix("&") || rest.hasPrefix("*") || rest.hasPrefix("|") || rest.hasPrefix(">")
                || rest.hasPrefix("{") || rest.hasPrefix("[") || rest.hasPrefix("!")
            {
                throw fail(lineNumber, "only plain or quoted scalar values are supported")
            }
            let scalar = try parseScalar(rest, line: lineNumber, fail: fail)
            sections[section]!.removeAll { $0.0 == key }
            sections[section]!.append((key, scalar))
        }
        // Merge keys: the section's own keys win over merged ones.
        for (section, aliases) in merges {
            var merged: [(String, Scalar)] = []
            for alias in aliases {
                guard let source = anchors[alias], let values = sections[source] else {
                    throw PrivatePubConfigurationError("\(file): unknown alias *\(alias) in \(section)")
                }
                for (k, v) in values where !merged.contains(where: { $0.0 == k }) { merged.append((k, v)) }
            }
            let own = sections[section] ?? []
            sections[section] = own + merged.filter { m in !own.contains { $0.0 == m.0 } }
        }
        return sections
    }

    /// The line without a trailing comment (a `#` at the start or after a space, outside quotes).
    static func stripComment(_ line: Substring) -> Substring {
        var quote: Character?
        var previous: Character = " "
        for index in line.indices {
            let c = line[index]
            if let q = quote {
                if c == q { quote = nil }
            } else if c == "\"" || c == "'" {
                if previous == " " || previous == ":" { quote = c }
            } else if c == "#", previous == " " || previous == "\t" {
                return trimTrailing(line[..<index])
            }
            previous = c
        }
        return trimTrailing(line)
    }

    static func trimTrailing(_ s: Substring) -> Substring {
        var s = s
        while let last = s.last, last == " " || last == "\t" { s = s.dropLast() }
        return s
    }

    /// `key: rest` → (key, rest); the key may be quoted.
    static func splitKey(_ body: Substring) -> (String, Substring)? {
        var key: String
        var afterKey: Substring
        if let first = body.first, first == "\"" || first == "'" {
            guard let close = body.dropFirst().firstIndex(of: first) else { return nil }
            key = String(body[body.index(after: body.startIndex)..<close])
            afterKey = body[body.index(after: close)...]
            guard afterKey.hasPrefix(":") else { return nil }
        } else {
            guard let colon = body.firstIndex(where: { $0 == ":" }) else { return nil }
            let next = body.index(after: colon)
            // "key:value" without a space is a plain scalar in YAML, not a mapping; find ": " or a final ":".
            var split = colon
            if next < body.endIndex, body[next] != " " {
                guard let spaced = body.firstRange(of: ": ")?.lowerBound else {
                    if body.hasSuffix(":") { split = body.index(before: body.endIndex) } else { return nil }
                    key = String(body[..<split])
                    return (key.trimmingSpaces, "")
                }
                split = spaced
            }
            key = String(body[..<split])
            afterKey = body[split...]
        }
        let rest = afterKey.dropFirst().drop(while: { $0 == " " })
        return (key.trimmingSpaces, rest)
    }

    static func parseScalar(
        _ text: Substring, line: Int, fail: (Int, String) -> PrivatePubConfigurationError
    ) throws -> Scalar {
        if text.isEmpty || text == "~" || text == "null" || text == "Null" || text == "NULL" {
            return Scalar(text: nil)
        }
        if text.hasPrefix("'") {
            guard text.count >= 2, text.hasSuffix("'") else { throw fail(line, "unterminated single-quoted string") }
            let inner = text.dropFirst().dropLast()
            return Scalar(text: String(inner.replacing("''", with: "'")))
        }
        if text.hasPrefix("\"") {
            guard text.count >= 2, text.hasSuffix("\""), !text.hasSuffix("\\\"") || text.hasSuffix("\\\\\"") else {
                throw fail(line, "unterminated double-quoted string")
            }
            return Scalar(text: try unescape(text.dropFirst().dropLast(), line: line, fail: fail))
        }
        return Scalar(text: String(text))
    }

    static func unescape(
        _ s: Substring, line: Int, fail: (Int, String) -> PrivatePubConfigurationError
    ) throws -> String {
        var out = ""
        var iterator = s.makeIterator()
        while let c = iterator.next() {
            guard c == "\\" else {
                out.append(c)
                continue
            }
            guard let e = iterator.next() else { throw fail(line, "dangling backslash") }
            switch e {
            case "\\": out.append("\\")
            case "\"": out.append("\"")
            case "/": out.append("/")
            case "n": out.append("\n")
            case "t": out.append("\t")
            case "r": out.append("\r")
            case "0": out.append("\0")
            case "u", "x":
                let width = e == "u" ? 4 : 2
                var digits = ""
                for _ in 0..<width { if let d = iterator.next() { digits.append(d) } }
                guard digits.count == width, let value = UInt32(digits, radix: 16),
                    let scalar = Unicode.Scalar(value)
                else { throw fail(line, "bad \\\(e) escape") }
                out.unicodeScalars.append(scalar)
            default:
                throw fail(line, "unsupported escape \\\(e)")
            }
        }
        return out
    }
}

extension StringProtocol {
    fileprivate var trimmingSpaces: String {
        String(drop(while: { $0 == " " }).reversed().drop(while: { $0 == " " }).reversed())
    }

}
