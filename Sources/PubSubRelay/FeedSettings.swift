import Bayeux
import Logging
import NIOCore

/// One feed's settings, read from an object of a relay configuration file (`"feeds": [{…}, …]`) with typed
/// accessors whose errors name the setting. Keys are the long CLI option names in snake_case (`--poll-interval` is
/// `poll_interval`), so the file and the command line read alike.
public struct FeedSettings: Sendable {
    public var object: JSONObject
    /// Where the object is, for messages (`feeds[0]`).
    public var context: String

    public init(_ object: JSONObject, context: String) {
        self.object = object
        self.context = context
    }

    /// Whether the source must read documents: for `data.doc` (`include_doc`), or because routes read them.
    public var needsDocuments: Bool {
        get throws { try bool("include_doc", default: false) || !(try strings("route")).isEmpty }
    }

    func error(_ key: String, _ problem: String) -> RelayError {
        RelayError(.configuration, "\(context).\(key): \(problem)")
    }

    public func string(_ key: String) throws -> String {
        guard let value = try optionalString(key) else { throw error(key, "missing (a string is required)") }
        return value
    }

    public func optionalString(_ key: String) throws -> String? {
        guard let value = object[key], !value.isNull else { return nil }
        guard let string = value.stringValue else { throw error(key, "expected a string") }
        return string
    }

    /// A string or an array of strings.
    public func strings(_ key: String) throws -> [String] {
        guard let value = object[key], !value.isNull else { return [] }
        if let string = value.stringValue { return [string] }
        guard let array = value.arrayValue else { throw error(key, "expected a string or an array of strings") }
        return try array.map {
            guard let string = $0.stringValue else { throw error(key, "expected a string or an array of strings") }
            return string
        }
    }

    public func int(_ key: String, default fallback: Int) throws -> Int {
        guard let value = object[key], !value.isNull else { return fallback }
        guard case .number(let text) = value, let int = Int(text) else { throw error(key, "expected an integer") }
        return int
    }

    public func double(_ key: String, default fallback: Double) throws -> Double {
        guard let value = object[key], !value.isNull else { return fallback }
        guard let double = value.doubleValue, double.isFinite else { throw error(key, "expected a number") }
        return double
    }

    public func bool(_ key: String, default fallback: Bool) throws -> Bool {
        guard let value = object[key], !value.isNull else { return fallback }
        guard case .bool(let bool) = value else { throw error(key, "expected true or false") }
        return bool
    }

    /// Refuses keys nobody reads, so a misspelt setting is an error instead of silently ignored.
    public func rejectUnknown(_ known: Set<String>) throws {
        for key in object.keys where !known.contains(key) {
            throw error(key, "unknown setting (known: \(known.sorted().joined(separator: ", ")))")
        }
    }
}

/// The sources a configuration file can name in `"source"`: each builds its `ChangeSource` from the same settings
/// its `pubsub relay <source>` subcommand takes as options.
public enum FeedKind: String, Sendable, CaseIterable {
    case postgres
    case simperium
    case blip
    case couchdb

    /// Settings every feed takes whatever its source: where it starts, what it publishes.
    public static let commonKeys: Set<String> = [
        "name", "source", "checkpoint", "prefix", "include_doc", "batch_size", "poll_interval", "route", "route_memory",
    ]

    /// A source from its settings; `routes` are the feed's (a PostgreSQL source checks its tables' replica
    /// identity against the columns they read).
    public func makeSource(_ settings: FeedSettings, routes: [Route] = [], logger: Logger) throws -> any ChangeSource {
        switch self {
        case .postgres:
            try settings.rejectUnknown(Self.commonKeys.union(PostgresChangeSource.Configuration.settingKeys))
            var configuration = try PostgresChangeSource.Configuration(settings: settings)
            do {
                try configuration.route(routes)
            } catch {
                throw settings.error("route", error.message)
            }
            return PostgresChangeSource(configuration: configuration, logger: logger)
        case .simperium:
            try settings.rejectUnknown(Self.commonKeys.union(SimperiumChangeSource.Configuration.settingKeys))
            return SimperiumChangeSource(configuration: try .init(settings: settings), logger: logger)
        case .blip:
            try settings.rejectUnknown(Self.commonKeys.union(BLIPChangeSource.Configuration.settingKeys))
            return BLIPChangeSource(configuration: try .init(settings: settings), logger: logger)
        case .couchdb:
            try settings.rejectUnknown(Self.commonKeys.union(CouchDBChangeSource.Configuration.settingKeys))
            return CouchDBChangeSource(configuration: try .init(settings: settings), logger: logger)
        }
    }
}

extension PostgresChangeSource.Configuration {
    static let settingKeys: Set<String> = [
        "dsn", "slot", "table", "max_changes", "plugin", "publication", "behind_mb",
    ]

    /// From `{"dsn", "slot", "table": [...], "max_changes"?, "poll_interval"?, "plugin"?, "publication"?,
    /// "behind_mb"?}`, validated as `pubsub relay postgres` validates its options.
    public init(settings: FeedSettings) throws {
        let dsn: PostgresDSN
        do {
            dsn = try PostgresDSN(try settings.string("dsn"))
        } catch let error as RelayError where error.code == .invalidURL {
            throw settings.error("dsn", error.message)
        }
        let slot = try settings.string("slot")
        guard PostgresChangeSource.isValidSlotName(slot) else {
            throw settings.error("slot", "lower-case letters, digits and underscores (at most 63)")
        }
        let tables = try settings.strings("table")
        guard !tables.isEmpty else { throw settings.error("table", "name at least one schema.table") }
        for table in tables {
            if let problem = PostgresChangeSource.tableNameProblem(table) { throw settings.error("table", problem) }
        }
        let maxChanges = try settings.int("max_changes", default: 5000)
        guard maxChanges > 0 else { throw settings.error("max_changes", "must be positive") }
        let behind = try settings.int("behind_mb", default: 64)
        guard (1...1_000_000).contains(behind) else { throw settings.error("behind_mb", "must be 1 to 1000000") }
        let poll = try settings.double("poll_interval", default: 0.1)
        guard poll > 0 && poll <= 3600 else { throw settings.error("poll_interval", "must be above 0 seconds") }
        self.init(
            dsn: dsn, slot: slot, tables: tables, maxChangesPerPeek: maxChanges,
            pollInterval: .nanoseconds(Int64(poll * 1e9)))
        behindBytes = UInt64(behind) << 20
        if let name = try settings.optionalString("plugin") {
            guard let plugin = PostgresChangeSource.Plugin(rawValue: name) else {
                throw settings.error("plugin", "pgoutput or wal2json")
            }
            self.plugin = plugin
        }
        if let publication = try settings.optionalString("publication") {
            guard PostgresChangeSource.isValidSlotName(publication) else {
                throw settings.error("publication", "lower-case letters, digits and underscores (at most 63)")
            }
            self.publication = publication
        }
    }
}

extension PostgresChangeSource.Configuration {
    /// Takes the columns `routes` read, each route's collection being one of the relayed tables.
    public mutating func route(_ routes: [Route]) throws(RelayError) {
        for route in routes {
            guard tables.contains(route.collection) else {
                throw RelayError(
                    .configuration,
                    "\(route): \(route.collection) is not a relayed table (\(tables.joined(separator: ", ")))")
            }
            routedColumns[route.collection, default: []].formUnion(route.fields.map { $0.path[0] })
        }
    }
}

extension PostgresChangeSource {
    /// Why `name` is not a `schema.table` the relay can filter on, or nil when it is.
    public static func tableNameProblem(_ name: String) -> String? {
        let parts = name.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty, !name.contains(",") else {
            return "\(name): expected schema.table, e.g. public.notes"
        }
        return nil
    }
}
