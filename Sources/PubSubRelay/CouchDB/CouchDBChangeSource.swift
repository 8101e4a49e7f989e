import AsyncHTTPClient
import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// A CouchDB-style `_changes` feed over HTTP(S): CouchDB 1.x (integer seqs), CouchDB 2+/Cloudant (opaque string
/// seqs), PouchDB Server, and Sync Gateway's REST feed (`12::34`-style seqs, channel filter, `removed`).
///
/// A background task reads the feed (`continuous`, `longpoll` or `eventsource`) into a bounded buffer, so reading
/// overlaps publishing; `next()` hands out up to `maxBatch` changes. Every seq is kept as the server wrote it (a
/// string seq without its JSON quotes) and sent back as `since` so. Positions (checkpoints) are the seq of the last change of a batch, or
/// a feed's `last_seq`.
///
/// * A dropped connection, a malformed row or no byte for twice the heartbeat: the connection is dropped, the buffer
///   emptied, and the feed reopened after a backoff from the last *confirmed* position (changes already handed out
///   come again with the same keys: at least once).
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
        /// The most changes read ahead of the relay.
        public var bufferCapacity: Int
        /// Which certificate authorities an `https://` server's certificate must come from.
        public var tls = FeedTLS()

        public init(url: CouchDBURL, feed: Feed = .continuous, heartbeat: TimeAmount = .seconds(10),
                    filter: String? = nil, channels: [String] = [], includeDocs: Bool = false,
                    initialSince: String = "0", maxBatch: Int = 500, bufferCapacity: Int = 2000) {
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
        /// The last position confirmed by the relay (or the start checkpoint).
        var confirmed: String?
        var pending: UInt64?
        var reader: Task<Void, Never>?
        /// A resync's first item is in the buffer and not handed out yet: if the buffer is emptied before it is, it
        /// is pushed again (the relay sees `ChangeBatch.resync` once per resync).
        var resyncQueued = false
    }

    public let sourceID: String
    public let configuration: Configuration
    let logger: Logger
    let client: HTTPClient
    let buffer: BoundedQueue<FeedItem>
    let state = Mutex(State())

    public init(configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        self.sourceID = "couchdb:" + configuration.url.feedName
        self.logger = logger
        var http = HTTPClient.Configuration()
        http.timeout = .init(connect: .seconds(10), read: nil)
        http.tlsConfiguration = configuration.tls.clientConfiguration
        self.client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: http)
        self.buffer = BoundedQueue(capacity: configuration.bufferCapacity)
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
        state.withLock { $0.confirmed = position }
        let start = since
        let task = Task { await self.read(from: start) }
        state.withLock { $0.reader = task }
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

    public func next() async throws -> ChangeBatch? {
        let max = configuration.maxBatch
        if let batch = await buffer.take(timeout: .milliseconds(250), { FeedItem.batch(of: $0, max: max) }) {
            if batch.resync != nil { state.withLock { $0.resyncQueued = false } }
            return batch
        }
        try Task.checkCancellation()
        return nil
    }

    /// The feed is read ahead into the buffer anyway; a batch handed out before the previous one is confirmed is
    /// never handed out again (only a lost connection re-reads from the confirmed position).
    public var readsAhead: Bool { true }

    public func confirm(_ position: String) async throws {
        state.withLock { $0.confirmed = position }
    }

    /// `pending` of the last list or `last_seq` the server sent (CouchDB 2+), plus what is buffered.
    public func lag() async -> SourceLag? {
        guard let pending = state.withLock({ $0.pending }) else { return nil }
        return SourceLag(amount: pending + UInt64(buffer.count), unit: "changes")
    }

    public func close() async {
        let task = state.withLock { state -> Task<Void, Never>? in
            defer { state.reader = nil }
            return state.reader
        }
        task?.cancel()
        await task?.value
        try? await client.shutdown()
    }

    deinit {
        // A source that was never closed still releases its client (a second shutdown is a no-op error).
        let client = client
        Task { try? await client.shutdown() }
    }

    // MARK: - Reading

    /// The reader: reads the feed into the buffer until cancelled, reconnecting and resyncing as needed.
    func read(from start: String) async {
        var since = start
        /// While a full resync is read: its reason (`since` is then the last seq of the snapshot read so far).
        var snapshot: String?
        /// The resync's first item is still to be pushed.
        var announce = false
        var snapshotRows = 0
        var delay = TimeAmount.milliseconds(100)
        while !Task.isCancelled {
            do {
                if let reason = snapshot {
                    if announce {
                        state.withLock { $0.resyncQueued = true }
                        try await buffer.push(.resync(reason))
                        announce = false
                    }
                    let page = try await list(since: since, feed: "normal", limit: configuration.maxBatch)
                    for row in page.rows {
                        try await buffer.push(.change(row.change(collection: configuration.url.collection, resync: true)))
                    }
                    try await buffer.push(.position(page.lastSeq))
                    state.withLock { $0.pending = page.pending }
                    since = page.lastSeq
                    snapshotRows += page.rows.count
                    if page.rows.count < configuration.maxBatch {
                        snapshot = nil
                        logger.notice("full resync read; following the feed again", metadata: metadata.merging(
                            ["pubsub.relay.changes": "\(snapshotRows)", "pubsub.relay.since": "\(since)"]) { $1 })
                    }
                } else if configuration.feed == .longpoll {
                    let result = try await list(since: since, feed: "longpoll")
                    for row in result.rows {
                        try await buffer.push(.change(row.change(collection: configuration.url.collection)))
                    }
                    try await buffer.push(.position(result.lastSeq))
                    state.withLock { $0.pending = result.pending }
                    since = result.lastSeq
                } else {
                    since = try await stream(since: since)
                }
                delay = .milliseconds(100)
            } catch is CancellationError {
                return
            } catch let error as UnknownSince {
                if snapshot == nil {
                    logger.error("the server does not know the position: FULL RESYNC from since=0",
                                 metadata: metadata.merging(["pubsub.relay.reason": "\(error.reason)"]) { $1 })
                    snapshot = error.reason
                    announce = true
                    snapshotRows = 0
                }
                // During a resync: nothing of the snapshot was confirmed yet, the snapshot starts over.
                since = "0"
            } catch {
                if Task.isCancelled { return }
                let (confirmed, lostResync) = state.withLock { state in
                    buffer.clear()
                    return (state.confirmed, state.resyncQueued)
                }
                if snapshot != nil && lostResync { announce = true }
                since = confirmed ?? start
                logger.warning("lost the _changes feed; reconnecting from the last confirmed position", metadata: metadata.merging([
                    "pubsub.relay.error": "\(FeedTLS.describe(error))", "pubsub.relay.since": "\(since)",
                    "pubsub.relay.retry_ms": "\(delay.nanoseconds / 1_000_000)",
                ]) { $1 })
                do {
                    try await Task.sleep(nanoseconds: UInt64(delay.nanoseconds))
                } catch {
                    return
                }
                delay = min(delay * 2, .seconds(5))
            }
        }
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
        let response = try await client.execute(request(since: since, feed: feed, limit: limit), deadline: .distantFuture,
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

    /// A `continuous` or `eventsource` feed, pushed row by row; returns the position to continue from when the
    /// server ends the feed cleanly.
    func stream(since start: String) async throws -> String {
        let feed = configuration.feed
        let response = try await open(since: start, feed: feed.rawValue)
        let collection = configuration.url.collection
        return try await watched(response.body) { [self] chunks in
            var since = start
            var continuous = ContinuousFeedParser()
            var events = EventSourceFeedParser()
            for try await chunk in chunks {
                Activity.touch()
                let parsed = feed == .eventsource ? try events.feed(chunk) : try continuous.feed(chunk)
                for event in parsed {
                    switch event {
                    case .row(let row):
                        try await buffer.push(.change(row.change(collection: collection)))
                        since = row.seq
                    case .end(let lastSeq, let pending):
                        try await buffer.push(.position(lastSeq))
                        state.withLock { $0.pending = pending }
                        since = lastSeq
                    case .heartbeat:
                        break
                    }
                }
                Activity.touch()
            }
            if continuous.lines.hasPartialLine || events.lines.hasPartialLine {
                throw RelayError(.feed, "the feed ended in the middle of a row")
            }
            return since
        }
    }

    /// Runs `body` over the response body, dropping the connection when no byte came for twice the heartbeat (time
    /// spent waiting for room in the buffer does not count).
    func watched<T: Sendable>(_ chunks: HTTPClientResponse.Body,
                              _ body: @escaping @Sendable (HTTPClientResponse.Body) async throws -> T) async throws -> T {
        let limit = configuration.heartbeat * 2
        let activity = Activity()
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await Activity.$current.withValue(activity) { try await body(chunks) } }
            group.addTask {
                while true {
                    try await Task.sleep(nanoseconds: UInt64(max(limit.nanoseconds / 4, 1_000_000)))
                    if activity.silence > limit {
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

/// When the current feed last showed life.
final class Activity: Sendable {
    @TaskLocal static var current: Activity?
    private let last = Mutex(NIODeadline.now())

    static func touch() { current?.last.withLock { $0 = .now() } }

    var silence: TimeAmount { .now() - last.withLock { $0 } }
}

extension String {
    var trimmingWhitespace: String {
        var text = Substring(self)
        while let first = text.first, first.isWhitespace { text.removeFirst() }
        while let last = text.last, last.isWhitespace { text.removeLast() }
        return String(text)
    }
}

extension CouchDBChangeSource {
    /// What the feed reader hands to the relay through the bounded buffer; `push` waits while it is full.
    enum FeedItem: Sendable {
        case change(Change)
        /// A position without a change (`last_seq`).
        case position(String)
        /// The following items are a full resync; the batch starting here carries the reason.
        case resync(String)

        /// Up to `max` changes from the front of `items` as a batch, never across the start of a resync, with the
        /// number of items it takes; nil while no position is there yet.
        static func batch(of items: ArraySlice<FeedItem>, max: Int) -> (count: Int, result: ChangeBatch)? {
            var changes: [Change] = []
            var position: String?
            var resync: Resync?
            var taken = 0
            for item in items {
                switch item {
                case .resync(let reason):
                    if taken > 0 { break }
                    resync = Resync(reason: reason)
                    taken += 1
                    continue
                case .change(let change):
                    if changes.count >= max { break }
                    changes.append(change)
                    position = change.seq
                    taken += 1
                    continue
                case .position(let seq):
                    position = seq
                    taken += 1
                    continue
                }
                break
            }
            guard let position else { return nil }
            return (taken, ChangeBatch(changes: changes, position: position, resync: resync))
        }
    }
}
