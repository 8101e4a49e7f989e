#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// `PUBSUB_*` environment variables, the fallback for every flag.
enum Environment {
    static func string(_ name: String) -> String? {
        guard let raw = getenv(name) else { return nil }
        let value = String(cString: raw)
        return value.isEmpty ? nil : value
    }

    static func value<T: LosslessStringConvertible>(_ name: String, as type: T.Type) throws -> T? {
        guard let text = string(name) else { return nil }
        guard let value = T(text) else { throw EnvironmentError(name: name, value: text) }
        return value
    }
}

struct EnvironmentError: Error, CustomStringConvertible {
    var name: String
    var value: String
    var description: String { "invalid value '\(value)' in environment variable \(name)" }
}
