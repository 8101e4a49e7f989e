import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import WSClient

/// The Simperium streaming API (`wss://api.simperium.com/sock/1/<app>/websocket`) for one bucket.
///
/// Opens the bucket with `init` and a token (a refused or expired token is fatal). With a checkpoint it asks for
/// the changes after the checkpointed change version (`cv:<cv>` → `c:[…]`), then receives live `c` pushes.
/// Without one, or when the server does not know the version (`cv:?`), it pages through the full index
/// (`i::<mark>::<limit>`), publishing every entity as an `update` with `resync: true`, and checkpoints the index's
/// `current` version only once the whole index is relayed; it then catches up from there. With `includeDocuments`
/// (`--include-doc`, or routes, which read the documents) every change but a delete waits for its entity version
/// (`e:<id>.<v>`, the `data` of the answer going into `Change.document`), in feed order; a version that no longer
/// exists (`?`) skips its change, whose position still counts. Every change carries the token's user as the route
/// variable `user`. Sends `h:<n>` after a quiet period and reconnects when no `h` comes back in time, when the
/// connection drops or when the server sends something malformed, from the position of the last batch handed to
/// the relay (what the connection read but had not handed over is read again).
///
/// What one server message brings is handed to the relay at once, as a batch of at most `batchSize` changes, through
/// a bounded `ChangeStream`: the relay waits on it, and the connection stops reading while the relay is behind.
public final class SimperiumChangeSource: ChangeSource {
    public struct Configuration: Sendable {
        /// The full WebSocket URL (see `websocketURL(base:appID:)`).
        public var url: String
        public var appID: String
        public var token: String
        public var bucket: String
        /// Names this client to the server (`clientid` of `init`).
        public var clientID: String
        /// Entities per index page (`limit` of `i`).
        public var indexPageSize: Int
        /// Changes per batch handed to the relay.
        public var batchSize: Int
        /// Entries read ahead of the relay at most (as batches of up to `batchSize`: at least two batches).
        public var bufferCapacity: Int
        /// Fetch each entity version (`e:<id>.<v>`) and put it in `Change.document`.
        public var includeDocuments: Bool
        /// Quiet time after which `h:<n>` is sent.
        public var heartbeatInterval: TimeAmount
        /// How long the answer to a heartbeat may take before the connection is taken as dead.
        public var heartbeatTimeout: TimeAmount
        /// The first pause before a reconnection; doubles up to `maxReconnectDelay`.
        public var reconnectDelay: TimeAmount
        public var maxReconnectDelay: TimeAmount
        /// Which certificate authorities a `wss://` server's certificate must come from.
        public var tls = FeedTLS()

        public init(
            url: String, appID: String, token: String, bucket: String, clientID: String = "pubsub-relay",
            indexPageSize: Int = 100, batchSize: Int = 100, bufferCapacity: Int = 1000,
            includeDocuments: Bool = false, heartbeatInterval: TimeAmount = .seconds(20),
            heartbeatTimeout: TimeAmount = .seconds(10),
            reconnectDelay: TimeAmount = .milliseconds(100), maxReconnectDelay: TimeAmount = .seconds(5)
        ) {
            self.url = url
            self.appID = appID
            self.token = token
            self.bucket = bucket
            self.clientID = clientID
            self.indexPageSize = indexPageSize
            self.batchSize = batchSize
            self.bufferCapacity = bufferCapacity
            self.includeDocuments = includeDocuments
            self.heartbeatInterval = heartbeatInterval
            self.heartbeatTimeout = heartbeatTimeout
            self.reconnectDelay = reconnectDelay
            self.maxReconnectDelay = maxReconnectDelay
        }

        /// `base` used as it is when it has a path; otherwise (or when nil: `wss://api.simperium.com`) with
        /// `/sock/1/<app>/websocket` appended.
        public static func websocketURL(base: String?, appID: String) -> String {
            var base = base ?? "wss://api.simperium.com"
            let afterScheme = base.split(separator: "/", omittingEmptySubsequences: false).dropFirst(3)
            if afterScheme.contains(where: { !$0.isEmpty }) { return base }
            while base.hasSuffix("/") { base.removeLast() }
            return base + "/sock/1/\(appID)/websocket"
        }
    }

    private struct State {
        var starting: CheckedContinuation<Void, any Error>?
        /// The connection in progress, or the last one.
        var session: SimperiumSession?
    }

    public let sourceID: String
    public let configuration: Configuration
    private let logger: Logger
    private let feed: PushFeed
    private let state = NIOLockedValueBox(State())
    private let eventLoopGroup: any EventLoopGroup

    public init(
        configuration: Configuration, logger: Logger,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) {
        self.configuration = configuration
        self.sourceID = "simperium:\(configuration.appID)/\(configuration.bucket)"
        self.logger = logger
        self.feed = PushFeed(capacity: max(2, configuration.bufferCapacity / max(1, configuration.batchSize)))
        self.eventLoopGroup = eventLoopGroup
    }

    /// How many connections were opened so far (for tests and logs).
    public var connections: Int { feed.connections }

    /// Connects, and returns once the server accepted the token (or throws: a refused token, no server).
    public func start(after position: String?) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            state.withLockedValue { $0.starting = continuation }
            feed.start(
                after: position,
                backoff: Backoff(initial: configuration.reconnectDelay, maximum: configuration.maxReconnectDelay),
                connect: { [self] resume in try await connect(resumeFrom: resume) },
                ended: { [self] _, backoff in ended(backoff: backoff) })
        }
    }

    /// The next batch the connection handed over, waiting for it; nil once the source is closed. Throws the fatal
    /// error (a refused token) that ended the feed, after the batches read before it.
    public func next() async throws -> ChangeBatch? {
        try await feed.next()
    }

    /// Nothing to do: a new connection resumes from where the last one handed over, never from a confirmed position.
    public func confirm(_ position: String) async throws {}

    public func lag() async -> SourceLag? {
        SourceLag(amount: UInt64(feed.stream.bufferedChanges), unit: "changes read ahead")
    }

    public func close() async {
        await feed.close()
        finishStarting(CancellationError())
    }

    // MARK: - Connections

    private func finishStarting(_ error: (any Error)?) {
        let continuation = state.withLockedValue { state -> CheckedContinuation<Void, any Error>? in
            defer { state.starting = nil }
            return state.starting
        }
        if let error { continuation?.resume(throwing: error) } else { continuation?.resume() }
    }

    /// One connection, resuming after `resumeFrom` ("" or nil: the full index first); why it ended is kept on the
    /// session.
    private func connect(resumeFrom: String?) async throws {
        let session = SimperiumSession(
            configuration: configuration, resumeFrom: resumeFrom, feed: feed,
            logger: logger
        ) { self.finishStarting(nil) }
        state.withLockedValue { $0.session = session }
        do {
            try await WebSocketClient.connect(
                url: configuration.url, configuration: .init(maxFrameSize: 1 << 24, closeTimeout: .seconds(2)),
                tlsConfiguration: configuration.tls.clientConfiguration, eventLoopGroup: eventLoopGroup,
                logger: logger
            ) { inbound, outbound, _ in
                try await session.run(inbound: inbound, outbound: outbound)
            }
            session.fail(RelayError(.source, "the server closed the connection"))
        } catch {
            session.fail(error)
            // The relay is gone: nothing more to read for.
            if error is CancellationError { throw error }
        }
    }

    /// A refused token, or no server at all while starting, ends the feed; anything else reconnects.
    private func ended(backoff: Backoff) -> PushFeed.Next {
        guard let session = state.withLockedValue({ $0.session }) else { return .pause(reset: false) }
        let error = session.error ?? RelayError(.source, "the connection ended")
        if error.isFatal {
            finishStarting(error)
            return .stop(error)
        }
        if !session.authenticated && state.withLockedValue({ $0.starting != nil }) {
            let failure = RelayError(.sourceFatal, "cannot open \(configuration.url): \(Self.describe(error))")
            finishStarting(failure)
            return .stop(failure)
        }
        let delay = session.authenticated ? backoff.initial : backoff.current
        logger.warning(
            "simperium: connection lost; reconnecting",
            metadata: [
                "pubsub.relay.source": "\(sourceID)", "pubsub.relay.error": "\(Self.describe(error))",
                "pubsub.relay.delay_ms": "\(Backoff.milliseconds(delay))",
            ])
        return .pause(reset: session.authenticated)
    }

    public func describe(_ error: any Error) -> String { Self.describe(error) }

    static func describe(_ error: any Error) -> String {
        if let error = error as? RelayError { return error.message }
        return FeedTLS.describe(error)
    }
}

/// One item read from a Simperium stream for the relay: a change (or none, when only the position moves, as at the
/// end of an empty index) and the position to checkpoint once it and everything before it is relayed.
struct SimperiumEntry: Sendable {
    var change: Change?
    var position: String
    /// Set on the first entry of a full resync.
    var resync: Resync?
}

/// One connection: `init` → `auth`, then `cv` catch-up or the paged index, then live changes; heartbeats beside.
final class SimperiumSession: Sendable {
    private struct Activity {
        /// A heartbeat after `heartbeatInterval` of silence, the end when its answer takes over `heartbeatTimeout`;
        /// the wait for the relay does not count.
        var silence: SilenceDetector
        /// The number the next heartbeat carries: 0 first, then the last number the server sent back.
        var heartbeatCount: Int64 = 0
        var error: RelayError?
        var authenticated = false
    }

    enum Phase {
        case authenticating
        case indexing
        case catchingUp
        case live
    }

    let configuration: SimperiumChangeSource.Configuration
    let resumeFrom: String?
    let feed: PushFeed
    let logger: Logger
    let onAuthenticated: @Sendable () -> Void
    private let activity: NIOLockedValueBox<Activity>

    init(
        configuration: SimperiumChangeSource.Configuration, resumeFrom: String?, feed: PushFeed,
        logger: Logger, onAuthenticated: @escaping @Sendable () -> Void
    ) {
        self.configuration = configuration
        self.resumeFrom = resumeFrom
        self.feed = feed
        self.logger = logger
        self.onAuthenticated = onAuthenticated
        self.activity = NIOLockedValueBox(
            Activity(
                silence: SilenceDetector(
                    quiet: configuration.heartbeatInterval, answer: configuration.heartbeatTimeout, now: .now())))
    }

    var error: RelayError? { activity.withLockedValue { $0.error } }
    var authenticated: Bool { activity.withLockedValue { $0.authenticated } }

    /// Records why the connection ended (the first reason wins).
    func fail(_ error: any Error) {
        let failure = error as? RelayError ?? RelayError(.source, SimperiumChangeSource.describe(error))
        activity.withLockedValue { if $0.error == nil { $0.error = failure } }
    }

    func run(inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter) async throws {
        do {
            try await outbound.write(
                .text(
                    SimperiumMessage.initialize(
                        clientID: configuration.clientID, token: configuration.token, appID: configuration.appID,
                        bucket: configuration.bucket)))
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await self.read(inbound: inbound, outbound: outbound) }
                group.addTask { try await self.heartbeat(outbound: outbound) }
                defer { group.cancelAll() }
                _ = try await group.next()
            }
        } catch {
            fail(error)
            throw error
        }
    }

    private func heartbeat(outbound: WebSocketOutboundWriter) async throws {
        let shortest = min(configuration.heartbeatInterval, configuration.heartbeatTimeout)
        let tick = min(TimeAmount.milliseconds(250), .nanoseconds(shortest.nanoseconds / 4))
        while true {
            try await Task.sleep(nanoseconds: UInt64(max(tick.nanoseconds, 1_000_000)))
            let now = NIODeadline.now()
            let send = try activity.withLockedValue { activity -> Int64? in
                switch activity.silence.check(now: now) {
                case .fine:
                    return nil
                case .probe:
                    return activity.heartbeatCount
                case .dead:
                    throw RelayError(
                        .source,
                        "no answer to heartbeat h:\(activity.heartbeatCount) within \(configuration.heartbeatTimeout.nanoseconds / 1_000_000) ms"
                    )
                }
            }
            if let send { try await outbound.write(.text(SimperiumMessage.heartbeat(send))) }
        }
    }

    /// Hands `batch` (if any) to the relay, waiting while the relay is behind.
    private func hand(_ batch: ChangeBatch?) async throws {
        guard let batch else { return }
        activity.withLockedValue { $0.silence.wait() }
        defer { activity.withLockedValue { $0.silence.resume(now: .now()) } }
        try await feed.hand(batch)
    }

    private func read(inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter) async throws {
        let bucket = configuration.bucket
        var phase = Phase.authenticating
        /// The `current` of the index in progress (its first page), from which the catch-up starts after it.
        var indexCurrent: String?
        var resync: Resync?
        /// The version asked for with `cv`.
        var requested: String?
        /// `{user}` in routes: the user the server authenticated the token as.
        var variables: [String: String] = [:]
        let startPosition = resumeFrom ?? ""
        /// Entries waiting, in feed order, for the document (`e:<id>.<v>` asked, key `<id>.<v>`) of themselves or
        /// of an entry before them.
        var held: [(entry: SimperiumEntry, key: String?)] = []
        /// Answers to `e` requests not yet attached (nil: the version no longer exists).
        var documents: [String: JSONObject?] = [:]
        var asked: Set<String> = []
        /// What this message brought, handed over when it is read (a full batch at once).
        var collector = BatchCollector(limit: configuration.batchSize)

        func put(_ entry: SimperiumEntry) async throws {
            if let resync = entry.resync { try await hand(collector.startResync(resync)) }
            try await hand(collector.add(entry.change, position: entry.position))
        }

        func send(_ text: String) async throws { try await outbound.write(.text(text)) }

        func flush() async throws {
            while let (entry, key) = held.first {
                var entry = entry
                if let key {
                    guard let document = documents[key] else { return }
                    if let document {
                        entry.change?.document = document
                    } else {
                        // The version no longer exists (`e:…\n?`): the entity changed again or was deleted since, and
                        // that later change follows in the feed. Handed out without its document, it would be routed
                        // as an entity without fields (its audience told `left`): only its position is kept.
                        logger.debug(
                            "simperium: an entity version is gone; its change is skipped, a later one follows",
                            metadata: ["pubsub.relay.entity": "\(key)"])
                        entry.change = nil
                    }
                }
                held.removeFirst()
                if let key, !held.contains(where: { $0.key == key }) { documents[key] = nil }
                try await put(entry)
            }
        }

        /// Hands `entry` on, after its document when documents are wanted.
        func enqueue(_ entry: SimperiumEntry, version: Int64?) async throws {
            guard configuration.includeDocuments, let change = entry.change, change.operation != .delete,
                let id = change.id, let version
            else {
                if held.isEmpty { try await put(entry) } else { held.append((entry, nil)) }
                return
            }
            let key = "\(id).\(version)"
            if documents[key] == nil && !asked.contains(key) {
                asked.insert(key)
                try await send(SimperiumMessage.entity(id: id, version: version))
            }
            held.append((entry, key))
            try await flush()
        }

        for try await message in inbound.messages(maxSize: 1 << 24) {
            activity.withLockedValue { $0.silence.heard(now: .now()) }
            guard case .text(let text) = message else {
                throw RelayError(.simperiumProtocol, "unexpected binary message")
            }
            let (channel, decoded) = try SimperiumMessage.decode(text)
            if let channel, channel != 0 { continue }
            switch decoded {
            case .heartbeat(let count):
                activity.withLockedValue { activity in
                    activity.silence.answered(now: .now())
                    activity.heartbeatCount = max(activity.heartbeatCount, count)
                }

            case .authenticationFailed(let reason):
                throw RelayError(
                    .sourceFatal,
                    "authentication refused for bucket \(bucket) of app \(configuration.appID): \(reason)")

            case .authenticated(let user):
                guard phase == .authenticating else { throw RelayError(.simperiumProtocol, "unexpected auth reply") }
                activity.withLockedValue { $0.authenticated = true }
                variables = ["user": user]
                logger.debug("simperium: authenticated", metadata: ["pubsub.relay.user": "\(user)"])
                onAuthenticated()
                if let cv = resumeFrom, !cv.isEmpty {
                    requested = cv
                    phase = .catchingUp
                    try await send(SimperiumMessage.changesSince(cv: cv))
                } else {
                    phase = .indexing
                    try await send(SimperiumMessage.index(mark: nil, limit: configuration.indexPageSize))
                }

            case .unknownVersion:
                guard phase == .catchingUp else { throw RelayError(.simperiumProtocol, "unexpected unknown cv reply") }
                let reason =
                    "the server does not know change version \(requested ?? "?") (cv:?): full index of bucket \(bucket)"
                logger.error("simperium: \(reason)")
                resync = Resync(reason: reason)
                indexCurrent = nil
                phase = .indexing
                try await send(SimperiumMessage.index(mark: nil, limit: configuration.indexPageSize))

            case .index(let page):
                guard phase == .indexing else { throw RelayError(.simperiumProtocol, "unexpected index page") }
                let current = indexCurrent ?? page.current
                indexCurrent = current
                let last = page.mark == nil
                if page.entries.isEmpty && last {
                    try await enqueue(SimperiumEntry(change: nil, position: current, resync: resync), version: nil)
                    resync = nil
                }
                for (offset, entry) in page.entries.enumerated() {
                    let change = Change(
                        collection: [bucket], id: entry.id, operation: .update, seq: "ev:\(entry.version)",
                        extra: ["rev": .number(String(entry.version)), "resync": true], variables: variables)
                    let position = last && offset == page.entries.count - 1 ? current : startPosition
                    try await enqueue(
                        SimperiumEntry(change: change, position: position, resync: resync),
                        version: entry.version)
                    resync = nil
                }
                if let mark = page.mark {
                    try await send(SimperiumMessage.index(mark: mark, limit: configuration.indexPageSize))
                } else {
                    requested = current
                    phase = .catchingUp
                    try await send(SimperiumMessage.changesSince(cv: current))
                }

            case .changes(let changes):
                // Pushes during the index are read again by the catch-up that follows it.
                guard phase == .catchingUp || phase == .live else { continue }
                phase = .live
                for change in changes {
                    if let code = change.error {
                        logger.warning(
                            "simperium: the server reported an error for a change",
                            metadata: [
                                "pubsub.relay.id": "\(change.id)", "pubsub.relay.code": "\(code)",
                            ])
                        continue
                    }
                    var extra: JSONObject = [:]
                    if let version = change.endVersion { extra["rev"] = .number(String(version)) }
                    try await enqueue(
                        SimperiumEntry(
                            change: Change(
                                collection: [bucket], id: change.id, operation: change.changeOperation,
                                seq: change.cv, extra: extra, variables: variables),
                            position: change.cv), version: change.endVersion)
                }

            case .entity(let key, let data):
                guard asked.remove(key) != nil else { continue }
                documents[key] = .some(data?.objectValue?["data"]?.objectValue)
                try await flush()
            }
            // What this message brought goes to the relay now: a live change waits for nothing.
            try await hand(collector.flush())
        }
        throw RelayError(.source, "the server closed the connection")
    }
}
