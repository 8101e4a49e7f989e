import Bayeux
import Logging
import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A relay configuration file: several feeds, each with its own source, checkpoint and channel mapping, run by
/// `pubsub relay run FILE` (publishing to a broker over Bayeux) or inside `pubsub serve --relay FILE` (publishing
/// in-process). JSON:
///
/// ```json
/// {
///   "url": "http://127.0.0.1:9292/faye",
///   "secret": "…",
///   "feeds": [
///     {"name": "notes", "source": "postgres", "dsn": "postgres://relay@127.0.0.1/app", "slot": "pubsub_notes",
///      "table": ["public.notes"], "checkpoint": "/var/lib/pubsub/notes.checkpoint", "include_doc": true}
///   ]
/// }
/// ```
///
/// `url`, `secret` and `token` (a JWT) are for the standalone relay only (flags and `PUBSUB_URL`/`PUBSUB_SECRET`/
/// `PUBSUB_TOKEN` override them). Every feed takes `name`, `source`, `checkpoint` (required, one file per feed),
/// `route` (routes to the audience, `"public.notes=/users/{owner_id}/notes"`, one or an array), `prefix` (default
/// `/changes`), `include_doc`, `batch_size` (messages per publish, default 100), `poll_interval` (PostgreSQL: seconds
/// of rest after a peek that drained the slot, default 0.1; the other sources push), and the settings of its source:
/// the long options of `pubsub relay <source>` in snake_case. Unknown settings are refused.
public struct RelayFile: Sendable {
    public struct Feed: Sendable {
        public var name: String
        public var kind: FeedKind
        public var settings: FeedSettings
        public var checkpoint: String
        public var mapping: ChangeMapping
        public var batchSize: Int
        /// `route_memory`: documents whose routed values are remembered (document sources with routes).
        public var rememberedDocuments: Int = 100_000

        /// A new source for this feed (not connected yet); called again when the feed is restarted after an error.
        public func makeSource(logger: Logger) throws -> any ChangeSource {
            try kind.makeSource(settings, routes: mapping.routeList, logger: logger)
        }
    }

    public var url: String?
    public var secret: String?
    /// A JWT the standalone relay publishes with (`ext.token`), for a broker that takes JWTs only.
    public var token: String?
    public var feeds: [Feed]

    /// Reads and checks the file; every source is built once, so a bad setting is reported before anything runs.
    public init(path: String, logger: Logger) throws {
        let bytes = try Self.contents(of: path) ?? []
        let value: JSONValue
        do {
            value = try JSONParser().parse(bytes)
        } catch {
            throw RelayError(.configuration, "\(path): not valid JSON (\(error))")
        }
        do {
            try self.init(json: value, logger: logger)
        } catch let error as RelayError where error.code == .configuration {
            throw RelayError(.configuration, "\(path): \(error.message)")
        }
    }

    public init(json value: JSONValue, logger: Logger) throws {
        guard let object = value.objectValue else { throw RelayError(.configuration, "expected a JSON object") }
        let top = FeedSettings(object, context: "relay")
        try top.rejectUnknown(["url", "secret", "token", "feeds"])
        url = try top.optionalString("url")
        secret = try top.optionalString("secret")
        token = try top.optionalString("token")
        guard let list = object["feeds"]?.arrayValue, !list.isEmpty else {
            throw RelayError(.configuration, "feeds: expected a non-empty array of feeds")
        }
        var feeds: [Feed] = []
        var names = Set<String>()
        var checkpoints = Set<String>()
        for (index, element) in list.enumerated() {
            let context = "feeds[\(index)]"
            guard let feedObject = element.objectValue else {
                throw RelayError(.configuration, "\(context): expected an object")
            }
            let settings = FeedSettings(feedObject, context: context)
            let name = try settings.optionalString("name") ?? "feed\(index)"
            guard names.insert(name).inserted else { throw settings.error("name", "\(name) names two feeds") }
            let kindName = try settings.string("source")
            guard let kind = FeedKind(rawValue: kindName) else {
                let known = FeedKind.allCases.map(\.rawValue).joined(separator: ", ")
                throw settings.error("source", "unknown source \(kindName) (known: \(known))")
            }
            let checkpoint = try settings.string("checkpoint")
            guard !checkpoint.isEmpty else { throw settings.error("checkpoint", "must name a file") }
            guard checkpoints.insert(checkpoint).inserted else {
                throw settings.error("checkpoint", "\(checkpoint) is used by two feeds: each feed needs its own")
            }
            let prefix = try settings.optionalString("prefix") ?? "/changes"
            guard ChangeMapping.isValidPrefix(prefix) else {
                throw settings.error("prefix", "must be a channel name outside /meta and /service, e.g. /changes")
            }
            let batchSize = try settings.int("batch_size", default: 100)
            guard batchSize > 0 else { throw settings.error("batch_size", "must be positive") }
            var routes: [Route] = []
            for text in try settings.strings("route") {
                do {
                    routes.append(try Route(parsing: text))
                } catch {
                    throw settings.error("route", error.message)
                }
            }
            let remembered = try settings.int("route_memory", default: 100_000)
            guard remembered > 0 else { throw settings.error("route_memory", "must be positive") }
            var feed = Feed(
                name: name, kind: kind, settings: settings, checkpoint: checkpoint,
                mapping: ChangeMapping(
                    prefix: prefix, includeDocument: try settings.bool("include_doc", default: false), routes: routes),
                batchSize: batchSize)
            feed.rememberedDocuments = remembered
            _ = try feed.makeSource(logger: logger)  // checks the source's settings; nothing connects yet
            feeds.append(feed)
        }
        self.feeds = feeds
    }

    static func contents(of path: String, limit: Int = 4 << 20, missingIsNil: Bool = false) throws -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 && errno == ENOENT && missingIsNil { return nil }
        if fd < 0 { throw RelayError(.configuration, "cannot read \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw RelayError(.configuration, "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            if n == 0 { return bytes }
            bytes += chunk[0..<n]
            if bytes.count > limit { throw RelayError(.configuration, "\(path) is larger than \(limit >> 20) MiB") }
        }
    }
}
