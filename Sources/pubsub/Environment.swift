import ArgumentParser
import Logging
import PubSubCore
import PubSubRelay

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// `PUBSUB_*` environment variables, the fallback for every flag: a variable is read as its flag would be (the
/// same `ExpressibleByArgument` type), so that both take the same values and refuse the same ones.
enum Environment {
    static func string(_ name: String) -> String? {
        guard let raw = getenv(name) else { return nil }
        let value = String(cString: raw)
        return value.isEmpty ? nil : value
    }

    static func value<T: ExpressibleByArgument>(_ name: String, as type: T.Type) throws -> T? {
        guard let text = string(name) else { return nil }
        guard let value = T(argument: text) else {
            // A usage error, as the same value given to the flag is (exit status 64).
            let choices = T.allValueStrings.isEmpty ? "" : " (one of \(T.allValueStrings.joined(separator: ", ")))"
            throw ValidationError("invalid value '\(text)' in environment variable \(name)\(choices)")
        }
        return value
    }

    /// The flag's value, else its variable's, else nil.
    static func pick<T: ExpressibleByArgument>(_ flag: T?, _ name: String) throws -> T? {
        if let flag { return flag }
        return try value(name, as: T.self)
    }

    /// The flag's value, else its variable's, else `fallback`.
    static func pick<T: ExpressibleByArgument>(_ flag: T?, _ name: String, _ fallback: T) throws -> T {
        try pick(flag, name) ?? fallback
    }

    /// A `@Flag`: set on the command line, or its variable set to `1`, `true` or `yes`.
    static func isSet(_ flag: Bool, _ name: String) -> Bool {
        flag || ["1", "true", "yes"].contains(string(name)?.lowercased() ?? "")
    }
}

/// `--engine`: where sessions live.
enum EngineKind: String, ExpressibleByArgument, CaseIterable, Sendable {
    /// One node, in its memory.
    case memory
    /// Several nodes sharing sessions through Redis (one server, Sentinel or Cluster).
    case redis
}

/// An option that is `on` or `off` (`--websocket-compression`).
enum Switch: String, ExpressibleByArgument, CaseIterable, Sendable {
    case on
    case off

    var isOn: Bool { self == .on }
}

/// `--log-level trace|debug|info|notice|warning|error|critical`.
extension Logger.Level: @retroactive ExpressibleByArgument {}

/// `--signatures privatepub|hmac|both`.
extension SignatureScheme: ExpressibleByArgument {}

/// `pubsub relay couchdb --feed continuous|longpoll|eventsource`: the `_changes` feeds the relay follows
/// (`normal` is what a full resync pages through, not a feed to follow).
extension CouchDBChangeSource.Feed: ExpressibleByArgument {}
