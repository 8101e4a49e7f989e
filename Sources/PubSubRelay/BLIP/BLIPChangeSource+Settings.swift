extension BLIPChangeSource.Configuration {
    static let settingKeys = FeedTLS.settingKeys.union(
        ["sg_url", "user", "password", "channel", "batch", "active_only"])

    /// From `{"sg_url", "user"?, "password"?, "channel": [...]?, "batch"?, "active_only"?, "feed_ca_file"?}`, validated as
    /// `pubsub relay blip` validates its options.
    public init(settings: FeedSettings) throws {
        let url: BLIPURL
        do {
            url = try BLIPURL(
                try settings.string("sg_url"), username: try settings.optionalString("user"),
                password: try settings.optionalString("password"))
        } catch let error as RelayError where error.code == .invalidURL {
            throw settings.error("sg_url", error.message)
        }
        let channels = try settings.strings("channel")
        for name in channels where name.isEmpty || name.contains(",") {
            throw settings.error("channel", "a non-empty channel name without commas")
        }
        let batch = try settings.int("batch", default: 200)
        guard batch > 0 else { throw settings.error("batch", "must be positive") }
        self.init(
            url: url, channels: channels, batch: batch, activeOnly: try settings.bool("active_only", default: false),
            includeDocuments: try settings.needsDocuments)
        tls = try FeedTLS(settings: settings)
    }
}
