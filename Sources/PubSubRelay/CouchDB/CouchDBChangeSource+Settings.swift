import NIOCore

extension CouchDBChangeSource.Configuration {
    static let settingKeys = FeedTLS.settingKeys.union(
        ["db_url", "feed", "heartbeat", "filter", "channel", "since", "max_batch"])

    /// From `{"db_url", "feed"?, "heartbeat"? (ms), "filter"?, "channel"? (string or array), "since"? ("0" or
    /// "now"), "max_batch"?, "feed_ca_file"?}` plus the common `include_doc`, validated as `pubsub relay couchdb` validates its
    /// options.
    public init(settings: FeedSettings) throws {
        let url: CouchDBURL
        do {
            url = try CouchDBURL(try settings.string("db_url"))
        } catch let error as RelayError where error.code == .invalidURL {
            throw settings.error("db_url", error.message)
        }
        let feedName = try settings.optionalString("feed") ?? "continuous"
        guard let feed = CouchDBChangeSource.Feed(rawValue: feedName) else {
            throw settings.error("feed", "continuous, longpoll or eventsource")
        }
        let heartbeat = try settings.int("heartbeat", default: 10000)
        guard heartbeat > 0 else { throw settings.error("heartbeat", "must be positive (milliseconds)") }
        let since = try settings.optionalString("since") ?? "0"
        guard since == "0" || since == "now" else { throw settings.error("since", "0 or now") }
        let maxBatch = try settings.int("max_batch", default: 500)
        guard maxBatch > 0 else { throw settings.error("max_batch", "must be positive") }
        self.init(
            url: url, feed: feed, heartbeat: .milliseconds(Int64(heartbeat)),
            filter: try settings.optionalString("filter"), channels: try settings.strings("channel"),
            includeDocs: try settings.needsDocuments, initialSince: since,
            maxBatch: maxBatch)
        tls = try FeedTLS(settings: settings)
    }
}
