import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

extension SimperiumChangeSource.Configuration {
    static let settingKeys = FeedTLS.settingKeys.union(
        ["app_id", "token", "bucket", "simperium_url", "heartbeat", "index_page"])

    /// From `{"app_id", "token"?, "bucket", "simperium_url"?, "heartbeat"?, "index_page"?, "feed_ca_file"?}`, validated as
    /// `pubsub relay simperium` validates its options; the token may come from `SIMPERIUM_TOKEN` instead.
    public init(settings: FeedSettings) throws {
        let appID = try settings.string("app_id")
        let bucket = try settings.string("bucket")
        let token = try settings.optionalString("token") ?? Self.environmentToken()
        guard let token, !token.isEmpty else {
            throw settings.error("token", "missing (or set SIMPERIUM_TOKEN)")
        }
        if let problem = Self.problem(appID: appID, bucket: bucket) { throw settings.error("app_id", problem) }
        let heartbeat = try settings.double("heartbeat", default: 20)
        guard heartbeat > 0, heartbeat <= 3600 else { throw settings.error("heartbeat", "seconds, in (0, 3600]") }
        let indexPage = try settings.int("index_page", default: 100)
        guard indexPage > 0, indexPage <= 1000 else { throw settings.error("index_page", "between 1 and 1000") }
        let url = Self.websocketURL(base: try settings.optionalString("simperium_url"), appID: appID)
        guard url.hasPrefix("ws://") || url.hasPrefix("wss://") else {
            throw settings.error("simperium_url", "a ws:// or wss:// URL")
        }
        let batchSize = try settings.int("batch_size", default: 100)
        self.init(
            url: url, appID: appID, token: token, bucket: bucket, indexPageSize: indexPage,
            batchSize: max(1, batchSize), includeDocuments: try settings.needsDocuments,
            heartbeatInterval: .nanoseconds(Int64(heartbeat * 1e9)),
            heartbeatTimeout: .nanoseconds(Int64(max(heartbeat / 2, 1) * 1e9)))
        tls = try FeedTLS(settings: settings)
    }

    /// `SIMPERIUM_TOKEN`, when set and not empty.
    public static func environmentToken() -> String? {
        guard let raw = getenv("SIMPERIUM_TOKEN") else { return nil }
        let value = String(cString: raw)
        return value.isEmpty ? nil : value
    }

    /// Why the app id or bucket name cannot be used, or nil: both go into the URL or the stream's messages, so
    /// they are limited to letters, digits, `-`, `_` and `.`.
    public static func problem(appID: String, bucket: String) -> String? {
        func valid(_ text: String) -> Bool {
            !text.isEmpty && text.utf8.count <= 128
                && text.unicodeScalars.allSatisfy {
                    $0.isASCII
                        && (($0.properties.isAlphabetic) || ("0"..."9").contains($0)
                            || "-_.".unicodeScalars.contains($0))
                }
        }
        if !valid(appID) { return "app id \(appID): letters, digits, -, _ and . only" }
        if !valid(bucket) { return "bucket \(bucket): letters, digits, -, _ and . only" }
        return nil
    }
}
