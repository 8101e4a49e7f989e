import AsyncHTTPClient
import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// A CouchDB-style `_changes` feed over HTTP(S): CouchDB 1.x (integer seqs), CouchDB 2+/Cloudant (opaque string
/// seqs), PouchDB Server, and Sync Gateway's REST feed (`12::34`-style seqs, channel filter, `removed`).
///
/// A background task reads the feed (`continuous`, `longpoll` or `eventsource`) and yields what each piece the
/// server sent holds as a batch of at most `maxBatch` changes into a bounded `ChangeStream`, which the relay waits
/// on: reading overlaps publishing, and the reader stops reading while the relay is behind. Every seq is kept as
/// the server wrote it (a string seq without its JSON quotes) and sent back as `since` so. Positions (checkpoints)
/// are the seq of the last change of a batch, or a feed's `last_seq`.
///
/// * A dropped connection, a malformed row or no byte for twice the heartbeat: the connection is dropped and the
///   feed reopened after a backoff from the position of the last batch handed to the relay (what the stream holds
///   is relayed; rows of the lost connection not yet handed over are read again). A new source starts from the
///   checkpoint: changes handed out but not confirmed come again with the same keys (at least once).
/// * An unknown `since` (HTTP 400, as CouchDB and Sync Gateway answer it): a full resync, read from `since=0` in pages
///   of `feed=normal&since=<last seq>&limit=<maxBatch>`, so only one page is held at a time; its changes carry
///   `extra.resync = true` and its first batch `ChangeBatch.resync`, logged at error. Positions inside the snapshot are
///   the rows' real seqs: a relay stopped mid-resync resumes from the snapshot seq it checkpointed, and a connection
///   lost mid-resync reads on from the confirmed seq. After a page shorter than `maxBatch` the feed is followed from
///   its `last_seq`.
/// * Rows: `deleted` → `delete`; revision generation 1 → `insert`; else `update`; `extra.rev` is the revision.
///   Sync Gateway's `removed: [channels]` (the document left the feed's channels) → `delete` with `extra.removed`
///   holding those channels.
public final class CouchDBChangeSource: ChangeSource {
    public enum Feed: String, Sendable, CaseIterable {
        case continuous
        case longpoll
        /// Server-Sent Events (CouchDB 1.3+ only; PouchDB Server and Sync Gateway have none).
        case eventsource
    }

    public struct Configuration: Sendable {
        public var url: CouchDBURL
        public var feed: Feed
        /// Asked of the server; a connection silent for twice as long is dropped.
        public var heartbeat: TimeAmount
        /// A filter name passed through (`ddoc/name`, `_design`, `sync_gateway/bychannel`).
        public var filter: String?
        /// Sync Gateway channels; implies `filter=sync_gateway/bychannel` when no filter is given.
        public var channels: [String]
        public var includeDocs: Bool
        /// Where a feed without a checkpoint starts: `0` (everything) or `now` (changes from now on).
        public var initialSince: String
        /// The most changes per batch handed to the relay, and the rows per page of a full resync.
        public var maxBatch: Int
        /// The most changes read ahead of the relay (as batches of up to `maxBatch`: at least two batches).
        public var bufferCapacity: Int
        /// Which certificate authorities an `https://` server's certificate must come from.
        public var tls = FeedTLS()

        public init(
            url: CouchDBURL, feed: Feed = .continuous, heartbeat: TimeAmount = .seconds(10),
            filter: String? = nil, channels: [String] = [], includeDocs: Bool = false,
            initialSince: String = "0", maxBatch: Int = 500, bufferCapacity: Int = 2000
        ) {
            self.url = url
            self.feed = feed
            self.heartbeat = heartbeat
            self.filter = filter
            self.channels = channels
            self.includeDocs = includeDocs
            self.initialSince = initialSince
            self.maxBatch = maxBatch
            self.bufferCapacity = bufferCapacity
        }
    }

    /// The server refused the `since` it was given (HTTP 400): a full resync follows.
    struct UnknownSince: Error {
        var reason: String
    }

    struct State {
        var pending: UInt64?
        /// While a full resync is read, page by page.
        var snapshot: Snapshot?
    }

    /// A full resync in progress: read from `since=0` in pages, the feed then followed from the last page's seq.
    struct Snapshot {
        var reason: String
        var rows = 0
        /// Whether a batch carried the resync to the relay yet.
        var announced = false
    }

    public let sourceID: String
    public let configuration: Configuration
    let logger: Logger
    let client: HTTPClient
    let feed: PushFeed
    let state = Mutex(State())

    public init(configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        self.sourceID = "couchdb:" + configuration.url.feedName
        self.logger = logger
        var http = HTTPClient.Configuration()
        http.timeout = .init(connect: .seconds(10), read: nil)
        http.tlsConfiguration = configuration.tls.clientConfiguration
        self.client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: http)
        self.feed = PushFeed(capacity: max(2, configuration.bufferCapacity / max(1, configuration.maxBatch)))
    }

    var metadata: Logger.Metadata { ["pubsub.relay.source": "\(sourceID)"] }

    /// Checks that the database answers (`GET /{db}`: reachable, authorised, existing), then starts reading after
    /// `position` (or from `initialSince`; `now` is pinned to the current seq first, with one
    /// `feed=normal&since=now` request, so a reconnect before the first confirm does not skip changes).
    public func start(after position: String?) async throws {
        var since = position ?? configuration.initialSince
        do {
            try await probe()
            if position == nil && since == "now" { since = try await list(since: "now", feed: "normal").lastSeq }
        } catch let error as UnknownSince {
            throw RelayError(.source, "the server refused the feed: \(error.reason)")
        } catch let error as RelayError where error.code == .source {
            throw error
        } catch {
            throw RelayError(.source, "cannot read \(configuration.url.base): \(FeedTLS.describe(error))")
        }
        feed.start(
            after: since, backoff: Backoff(initial: TimeAmount.milliseconds(100), maximum: .seconds(5)),
            connect: { [self] since in try await read(since: since ?? "0") },
            ended: { [self] error, backoff in ended(error, backoff: backoff) })
    }

    /// `GET /{db}`, which CouchDB, PouchDB Server and Sync Gateway all answer with the database's info.
    func probe() async throws {
        var request = HTTPClientRequest(url: configuration.url.base + "/")
        request.headers.add(name: "Accept", value: "application/json")
        if let user = configuration.url.user {
            request.setBasicAuth(username: user, password: configuration.url.password ?? "")
        }
        let response = try await client.execute(request, timeout: .seconds(30), logger: logger)
        let body = try? await response.body.collect(upTo: 64 << 10)
        guard response.status == .ok else {
            let detail = "HTTP \(response.status.code) \((body.map { String(buffer: $0) } ?? "").trimmingWhitespace)"
            if response.status == .unauthorized || response.status == .forbidden {
                throw RelayError(.source, "\(configuration.url.base): authentication refused: \(detail)")
            }
            if response.status == .notFound {
                throw RelayError(.source, "\(configuration.url.base): not found: \(detail)")
            }
            throw RelayError(.source, "\(configuration.url.base): \(detail)")
        }
    }

    /// The next batch the reader handed over, waiting for it; nil once the source is closed.
    public func next() async throws -> ChangeBatch? {
        try await feed.next()
    }

    /// Nothing to do: the feed is read on from where the reader is, never from a confirmed position.
    public func confirm(_ position: String) async throws {}

    /// `pending` of the last list or `last_seq` the server sent (CouchDB 2+), plus what waits in the stream.
    public func lag() async -> SourceLag? {
        guard let pending = state.withLock({ $0.pending }) else { return nil }
        return SourceLag(amount: pending + UInt64(feed.stream.bufferedChanges), unit: "changes")
    }

    public func close() async {
        await feed.close()
        try? await client.shutdown()
    }

    deinit {
        // A source that was never closed still releases its client (a second shutdown is a no-op error).
        let client = client
        Task { try? await client.shutdown() }
    }

    // MARK: - Reading

    /// One request of the reader: the next page of a full resync, one long poll, or the continuous feed until it
    /// ends; what it reads goes to the relay as it comes.
    func read(since: String) async throws {
        var collector = BatchCollector(limit: configuration.maxBatch)
        if let snapshot = state.withLock({ $0.snapshot }) {
            if !snapshot.announced { _ = collector.startResync(Resync(reason: snapshot.reason)) }
            let page = try await list(since: since, feed: "normal", limit: configuration.maxBatch)
            for row in page.rows {
                let change = row.change(collection: configuration.url.collection, resync: true)
                try await feed.hand(collector.add(change, position: change.seq))
            }
            _ = collector.add(nil, position: page.lastSeq)
            try await feed.hand(collector.flush())
            let rows = state.withLock { state -> Int in
                state.pending = page.pending
                state.snapshot?.announced = true
                state.snapshot?.rows += page.rows.count
                return state.snapshot?.rows ?? 0
            }
            if page.rows.count < configuration.maxBatch {
                state.withLock { $0.snapshot = nil }
                logger.notice(
                    "full resync read; following the feed again",
                    metadata: metadata.merging(
                        ["pubsub.relay.changes": "\(rows)", "pubsub.relay.since": "\(page.lastSeq)"]) { $1 })
            }
        } else if configuration.feed == .longpoll {
            let result = try await list(since: since, feed: "longpoll")
            for row in result.rows {
                let change = row.change(collection: configuration.url.collection)
                try await feed.hand(collector.add(change, position: change.seq))
            }
            _ = collector.add(nil, position: result.lastSeq)
            try await feed.hand(collector.flush())
            state.withLock { $0.pending = result.pending }
        } else {
            try await stream(since: since)
        }
    }

    /// After each request: on at once when it answered; a position the server does not know starts a full resync
    /// (during one, the snapshot starts over); anything else is a lost feed, opened again after a pause.
    func ended(_ error: (any Error)?, backoff: Backoff) -> PushFeed.Next {
        guard let error else { return .again }
        if let error = error as? UnknownSince {
            let starting = state.withLock { state -> Bool in
                guard state.snapshot == nil else { return false }
                state.snapshot = Snapshot(reason: error.reason)
                return true
            }
            if starting {
                logger.error(
                    "the server does not know the position: FULL RESYNC from since=0",
                    metadata: metadata.merging(["pubsub.relay.reason": "\(error.reason)"]) { $1 })
            }
            feed.resume(from: "0")
            return .again
        }
        logger.warning(
            "lost the _changes feed; reconnecting after the last change read",
            metadata: metadata.merging([
                "pubsub.relay.error": "\(FeedTLS.describe(error))", "pubsub.relay.since": "\(feed.resume ?? "0")",
                "pubsub.relay.retry_ms": "\(Backoff.milliseconds(backoff.current))",
            ]) { $1 })
        return .pause(reset: false)
    }

    func request(since: String, feed: String, limit: Int? = nil) -> HTTPClientRequest {
        var query = ["feed=\(feed)", "since=\(CouchDBURL.queryEncode(since))"]
        if let limit { query.append("limit=\(limit)") }
        if feed != "normal" { query.append("heartbeat=\(max(1, configuration.heartbeat.nanoseconds / 1_000_000))") }
        if configuration.includeDocs { query.append("include_docs=true") }
        let filter = configuration.filter ?? (configuration.channels.isEmpty ? nil : "sync_gateway/bychannel")
        if let filter { query.append("filter=\(CouchDBURL.queryEncode(filter))") }
        if !configuration.channels.isEmpty {
            query.append("channels=\(CouchDBURL.queryEncode(configuration.channels.joined(separator: ",")))")
        }
        var request = HTTPClientRequest(url: configuration.url.base + "/_changes?" + query.joined(separator: "&"))
        request.headers.add(name: "Accept", value: feed == "eventsource" ? "text/event-stream" : "application/json")
        if let user = configuration.url.user {
            request.setBasicAuth(username: user, password: configuration.url.password ?? "")
        }
        return request
    }

    /// Sends the request and checks the status: 400 for a `since` other than `0`/`now` is an unknown position.
    func open(since: String, feed: String, limit: Int? = nil) async throws -> HTTPClientResponse {
        let response = try await client.execute(
            request(since: since, feed: feed, limit: limit), deadline: .distantFuture,
            logger: logger)
        guard response.status == .ok else {
            let body = try? await response.body.collect(upTo: 64 << 10)
            let text = body.map { String(buffer: $0) } ?? ""
            let detail = "HTTP \(response.status.code) \(text.trimmingWhitespace) (since=\(since))"
            if response.status == .badRequest, since != "0", since != "now" { throw UnknownSince(reason: detail) }
            if response.status == .unauthorized || response.status == .forbidden {
                throw RelayError(.source, "\(configuration.url.base): authentication refused: \(detail)")
            }
            if response.status == .notFound {
                throw RelayError(.source, "\(configuration.url.base): not found: \(detail)")
            }
            throw RelayError(.feed, "\(configuration.url.base)/_changes: \(detail)")
        }
        return response
    }

    /// A `normal` or `longpoll` request (at most `limit` rows), read whole (heartbeat newlines are JSON whitespace).
    func list(since: String, feed: String, limit: Int? = nil) async throws
        -> (rows: [CouchDBRow], lastSeq: String, pending: UInt64?)
    {
        let response = try await open(since: since, feed: feed, limit: limit)
        let body = try await watched(response.body) { chunks in
            var bytes: [UInt8] = []
            for try await chunk in chunks {
                bytes += chunk.readableBytesView
                Activity.touch()
                if bytes.count > 256 << 20 { throw RelayError(.feed, "a _changes body larger than 256 MiB") }
            }
            return bytes
        }
        return try CouchDBFeedParser.list(body)
    }

    /// A `continuous` or `eventsource` feed, pushed row by row, until the server ends it.
    func stream(since start: String) async throws {
        let feed = configuration.feed
        let response = try await open(since: start, feed: feed.rawValue)
        let collection = configuration.url.collection
        try await watched(response.body) { [self] chunks in
            var continuous = ContinuousFeedParser()
            var events = EventSourceFeedParser()
            var collector = BatchCollector(limit: configuration.maxBatch)
            for try await chunk in chunks {
                Activity.touch()
                let parsed = feed == .eventsource ? try events.feed(chunk) : try continuous.feed(chunk)
                for event in parsed {
                    switch event {
                    case .row(let row):
                        let change = row.change(collection: collection)
                        try await hand(collector.add(change, position: change.seq))
                    case .end(let lastSeq, let pending):
                        _ = collector.add(nil, position: lastSeq)
                        state.withLock { $0.pending = pending }
                    case .heartbeat:
                        break
                    }
                }
                // What one piece of the body held goes over at once: a live change waits for nothing.
                try await hand(collector.flush())
                Activity.touch()
            }
            if continuous.lines.hasPartialLine || events.lines.hasPartialLine {
                throw RelayError(.feed, "the feed ended in the middle of a row")
            }
        }
    }

    /// Runs `body` over the response body, dropping the connection when no byte came for twice the heartbeat (time
    /// spent waiting for the relay to take what was read does not count).
    /// Hands `batch` (if any) to the relay; the wait for the relay does not count as the server's silence.
    func hand(_ batch: ChangeBatch?) async throws {
        guard batch != nil else { return }
        Activity.wait()
        defer { Activity.touch() }
        try await feed.hand(batch)
    }

    func watched<T: Sendable>(
        _ chunks: HTTPClientResponse.Body,
        _ body: @escaping @Sendable (HTTPClientResponse.Body) async throws -> T
    ) async throws -> T {
        let limit = configuration.heartbeat * 2
        let activity = Activity(limit: limit)
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await Activity.$current.withValue(activity) { try await body(chunks) } }
            group.addTask {
                while true {
                    try await Task.sleep(nanoseconds: UInt64(max(limit.nanoseconds / 4, 1_000_000)))
                    if activity.isDead {
                        throw RelayError(.feed, "no heartbeat for \(limit.nanoseconds / 1_000_000) ms")
                    }
                }
            }
            defer { group.cancelAll() }
            guard let result = try await group.next(), let value = result else { throw CancellationError() }
            return value
        }
    }
}

/// When the current feed last showed life (the feed cannot be asked: silence past `limit` is its end); while the
/// reader waits for the relay, the server is not to blame.
final class Activity: Sendable {
    @TaskLocal static var current: Activity?
    private let silence: Mutex<SilenceDetector>

    init(limit: TimeAmount) {
        silence = Mutex(SilenceDetector(quiet: limit, answer: nil, now: .now()))
    }

    static func touch() { current?.silence.withLock { $0.resume(now: .now()) } }

    /// The reader waits for the relay to take what it read: silence does not count until the next `touch`.
    static func wait() { current?.silence.withLock { $0.wait() } }

    var isDead: Bool {
        silence.withLock { $0.check(now: .now()) } != .fine
    }
}

extension String {
    var trimmingWhitespace: String {
        var text = Substring(self)
        while let first = text.first, first.isWhitespace { text.removeFirst() }
        while let last = text.last, last.isWhitespace { text.removeLast() }
        return String(text)
    }
}
