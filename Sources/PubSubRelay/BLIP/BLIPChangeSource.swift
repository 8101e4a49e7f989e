import Bayeux
import HTTPTypes
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOWebSocket
import WSClient

/// Couchbase Sync Gateway's replication protocol (BLIP v3, `CBMobile_3`): a WebSocket to `/{db}/_blipsync`, one
/// `subChanges` (continuous, from the checkpointed `since`), and the `changes` messages that follow. Each `changes`
/// message is answered only in `confirm(_:)`, once the relay persisted its entries, and with an empty array (no
/// bodies wanted): Sync Gateway limits how many it keeps unanswered, which gives natural backpressure. The feed is
/// read in a background task; each complete `changes` message is handed to the relay as one batch through a bounded
/// `ChangeStream`, which the relay waits on, so reading overlaps publishing and stops while the relay is behind.
///
/// With `includeDocuments` (`--include-doc`, or routes, which read the documents) a `changes` message is answered at
/// once with `[[], …]` (every revision wanted, no ancestors known, no `deltas`), so Sync Gateway sends each revision's
/// full body in a `rev` message (a tombstone's with `deleted`); the changes are handed out with their bodies in
/// `Change.document` once every `rev` (or `norev`) of the message arrived, and the `rev` messages that want a reply
/// are answered in `confirm(_:)`. A `norev` (the revision is gone, a later one follows) skips its change unless it is
/// a delete.
///
/// A dropped connection (or a BLIP protocol error: bad checksum, bad deflate data, a text message) reconnects with
/// backoff from the position of the last batch handed to the relay; a message not complete yet is read again. When
/// Sync Gateway refuses the `since` (an ERR reply to `subChanges`), the source starts over from `since=0`: those
/// changes carry `extra["resync"] = true`, and the first batch carries `ChangeBatch.resync`.
public actor BLIPChangeSource: ChangeSource {
    public struct Configuration: Sendable {
        /// `ws[s]://host[:port]/db` (user and password removed).
        public var url: BLIPURL
        /// Only changes of these Sync Gateway channels (`filter=sync_gateway/bychannel`); empty: every channel the
        /// user can see.
        public var channels: [String]
        /// `batch` of `subChanges` (entries per `changes` message), so the most changes per batch for the relay.
        public var batch: Int
        /// Leave out deleted documents (`activeOnly=true`).
        public var activeOnly: Bool
        /// `changes` messages read ahead of the relay (batches waiting in the stream).
        public var bufferedMessages: Int
        /// WebSocket ping interval; a connection without a pong in time is closed and reconnected.
        public var heartbeat: Duration
        public var reconnectDelay: Duration
        public var maxReconnectDelay: Duration
        /// Largest frame payload this side sends.
        public var maxFramePayload: Int
        /// Ask for every revision's body (`rev` messages) and put it in `Change.document`.
        public var includeDocuments: Bool
        /// Which certificate authorities a `wss://` server's certificate must come from.
        public var tls = FeedTLS()

        public init(
            url: BLIPURL, channels: [String] = [], batch: Int = 200, activeOnly: Bool = false,
            bufferedMessages: Int = 8, heartbeat: Duration = .seconds(30),
            reconnectDelay: Duration = .milliseconds(100), maxReconnectDelay: Duration = .seconds(5),
            maxFramePayload: Int = 16384, includeDocuments: Bool = false
        ) {
            self.url = url
            self.channels = channels
            self.batch = max(1, batch)
            self.activeOnly = activeOnly
            self.bufferedMessages = max(1, bufferedMessages)
            self.heartbeat = heartbeat
            self.reconnectDelay = reconnectDelay
            self.maxReconnectDelay = maxReconnectDelay
            self.maxFramePayload = maxFramePayload
            self.includeDocuments = includeDocuments
        }
    }

    /// The WebSocket subprotocols offered, preferred first.
    public static let subprotocols = ["BLIP_3+CBMobile_3", "BLIP_3+CBMobile_2"]

    /// One `changes` message as read, waiting for the relay.
    struct Delivery: Sendable {
        var generation: UInt64
        var changes: [Change]
        /// What to answer once the relay confirmed these changes: the `changes` message (`[]`), or with
        /// `includeDocuments` its `rev` messages (empty replies).
        var replies: [Reply]
        /// With `includeDocuments`: the changes (indices) whose revision Sync Gateway no longer had (`norev`), which
        /// are not handed out (their position still is).
        var skipped: Set<Int> = []
    }

    struct Reply: Sendable {
        var number: UInt64
        var body: [UInt8]
    }

    /// With `includeDocuments`: a `changes` message whose `rev` messages have not all arrived yet.
    struct AwaitingRevisions {
        var delivery: Delivery
        /// `id NUL rev` → index in `delivery.changes`.
        var missing: [String: Int]
    }

    /// A batch handed to the relay and not yet confirmed: what to answer once it is.
    struct HandedOut {
        var position: String
        var generation: UInt64
        var completes: [Reply]
    }

    public nonisolated let sourceID: String
    public let configuration: Configuration
    private let logger: Logger
    private let feed: PushFeed
    /// Bumped on every connection: what an older one will answer is dropped.
    private var generation: UInt64 = 0
    private var session: BLIPSession?
    private var awaitingRevisions: [AwaitingRevisions] = []
    private var handedOut: [HandedOut] = []
    /// Set while a full resync (from since 0 after a refused since) has not caught up yet.
    private var resyncing = false
    /// Reported on the first batch of a resync.
    private var pendingResync: Resync?
    private var caughtUp = false
    /// Whether the last connection received anything (the backoff then starts over).
    private var traffic = NIOLockedValueBox(false)
    private var started = false
    private var closed = false

    public init(configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        self.sourceID = "blip:" + configuration.url.hostAndPort + "/" + configuration.url.database
        self.logger = logger
        self.feed = PushFeed(capacity: configuration.bufferedMessages)
    }

    public func start(after position: String?) async throws {
        if let position {
            do {
                _ = try JSONParser().parse(position)
            } catch {
                throw RelayError(.blipProtocol, "checkpoint position \(position) is not a JSON Sync Gateway sequence")
            }
        }
        guard !started else { return }
        started = true
        // A new connection subscribes from the position of the last batch handed to the relay (JSON text of a seq).
        feed.start(
            after: position,
            backoff: Backoff(initial: configuration.reconnectDelay, maximum: configuration.maxReconnectDelay),
            connect: { [self] _ in try await connectOnce() },
            ended: { [self] error, backoff in await ended(error, backoff: backoff) })
    }

    /// The next batch the connection handed over, waiting for it; nil once the source is closed.
    public func next() async throws -> ChangeBatch? {
        try await feed.next()
    }

    /// Answers the `changes` (or `rev`) messages of every batch up to `position`, on the connection they came on.
    public func confirm(_ position: String) async throws {
        var replies: [Reply] = []
        while !handedOut.isEmpty {
            let batch = handedOut.removeFirst()
            if batch.generation == generation {
                replies += batch.completes
            }
            if batch.position == position { break }
        }
        guard let session, session.generation == generation else { return }
        for reply in replies {
            _ = try? session.send(BLIPMessage(type: .response, number: reply.number, body: reply.body))
        }
    }

    /// Changes read ahead of the relay (Sync Gateway does not tell how far behind its head the feed is).
    public func lag() async -> SourceLag? {
        SourceLag(
            amount: UInt64(feed.stream.bufferedChanges),
            unit: caughtUp ? "changes buffered" : "changes buffered, catching up")
    }

    /// Hands a complete `changes` message to the relay as one batch (without the entries whose revision is gone),
    /// waiting while the relay is behind; what to answer is kept until the relay confirms it.
    private func hand(_ delivery: Delivery) async throws {
        guard let position = delivery.changes.last?.seq else { return }
        var changes: [Change] = []
        changes.reserveCapacity(delivery.changes.count)
        for (offset, change) in delivery.changes.enumerated() where !delivery.skipped.contains(offset) {
            changes.append(change)
        }
        var resync: Resync?
        if let pending = pendingResync, changes.contains(where: { $0.extra["resync"] == .bool(true) }) {
            resync = pending
            pendingResync = nil
        }
        handedOut.append(HandedOut(position: position, generation: delivery.generation, completes: delivery.replies))
        try await feed.hand(ChangeBatch(changes: changes, position: position, resync: resync))
    }

    public func close() async {
        closed = true
        feed.cancel()
        await session?.close()
        await feed.close()
    }

    // MARK: - Connection

    /// One connection: what an older one queued for answering or still completes is dropped.
    private func connectOnce() async throws {
        guard !closed else { throw CancellationError() }
        generation += 1
        awaitingRevisions = []
        traffic = NIOLockedValueBox(false)
        defer { session = nil }
        try await connect(generation: generation, traffic: traffic)
    }

    private func ended(_ error: (any Error)?, backoff: Backoff) -> PushFeed.Next {
        if closed { return .pause(reset: false) }
        if let error {
            // A refused certificate will not fix itself: said at error level.
            logger.log(
                level: FeedTLS.isCertificateFailure(error) ? .error : .warning,
                "BLIP connection failed; reconnecting",
                metadata: metadata([
                    "pubsub.relay.error": "\(FeedTLS.describe(error))", "pubsub.relay.since": "\(feed.resume ?? "0")",
                ]))
        } else {
            logger.warning("Sync Gateway closed the BLIP connection; reconnecting", metadata: metadata())
        }
        return .pause(reset: traffic.withLockedValue { $0 })
    }

    private func connect(generation: UInt64, traffic: NIOLockedValueBox<Bool>) async throws {
        var headers = HTTPFields()
        headers[.secWebSocketProtocol] = Self.subprotocols.joined(separator: ", ")
        if let authorization = configuration.url.basicAuthorization { headers[.authorization] = authorization }
        let wsConfiguration = WebSocketClientConfiguration(
            maxFrameSize: 1 << 22, additionalHeaders: headers, closeTimeout: min(configuration.heartbeat, .seconds(5)),
            autoPing: .enabled(timePeriod: configuration.heartbeat))
        let maxFramePayload = configuration.maxFramePayload
        try await WebSocketClient.connect(
            url: configuration.url.endpoint, configuration: wsConfiguration,
            tlsConfiguration: configuration.tls.clientConfiguration, logger: logger
        ) { inbound, outbound, _ in
            let (frames, continuation) = AsyncStream.makeStream(of: [UInt8].self)
            let session = BLIPSession(
                generation: generation, maxFramePayload: maxFramePayload,
                outgoing: continuation, outbound: outbound)
            let writer = Task {
                for await frame in frames {
                    do { try await outbound.write(.binary(ByteBuffer(bytes: frame))) } catch { break }
                }
            }
            defer { writer.cancel() }
            do {
                guard try await self.attach(session) else { return }
                var decoder = BLIPFrameDecoder()
                for try await message in inbound.messages(maxSize: 1 << 22) {
                    guard case .binary(let buffer) = message else {
                        throw RelayError(.blipProtocol, "Sync Gateway sent a text WebSocket message")
                    }
                    traffic.withLockedValue { $0 = true }
                    for event in try decoder.receive(buffer.readableBytesView) {
                        switch event {
                        case .message(let message):
                            try await self.handle(message, session: session)
                        case .sendAck(let type, let number, let received):
                            session.sendAck(type, number: number, received: received)
                        case .ack:
                            break
                        }
                    }
                }
                continuation.finish()
            } catch {
                continuation.finish()
                await writer.value
                try? await outbound.close(
                    .protocolError, reason: "\(error)".count > 100 ? "protocol error" : "\(error)")
                throw error
            }
        }
    }

    /// Makes `session` the current connection and subscribes; false when the source closed meanwhile.
    private func attach(_ session: BLIPSession) throws -> Bool {
        guard !closed, session.generation == generation else { return false }
        self.session = session
        try subscribe(session, since: feed.resume)
        return true
    }

    private func subscribe(_ session: BLIPSession, since: String?) throws {
        var properties: [(String, String)] = [("Profile", "subChanges")]
        if let since { properties.append(("since", since)) }
        properties += [("continuous", "true"), ("batch", String(configuration.batch))]
        if configuration.activeOnly { properties.append(("activeOnly", "true")) }
        if !configuration.channels.isEmpty {
            properties += [
                ("filter", "sync_gateway/bychannel"),
                ("channels", configuration.channels.joined(separator: ",")),
            ]
        }
        session.subscription = (try session.send(BLIPMessage(type: .request, number: 0, properties: properties)), since)
        caughtUp = false
        logger.info("subscribed to Sync Gateway changes", metadata: metadata(["pubsub.relay.since": "\(since ?? "0")"]))
    }

    private func handle(_ message: BLIPMessage, session: BLIPSession) async throws {
        guard session.generation == generation, !closed else { return }
        switch message.type {
        case .request where message.profile == "changes":
            let changes = try parseChanges(message.body)
            if changes.isEmpty {
                if !caughtUp { logger.info("caught up with Sync Gateway", metadata: metadata()) }
                caughtUp = true
                resyncing = false
                if !message.flags.contains(.noReply) {
                    try session.send(BLIPMessage(type: .response, number: message.number, body: Array("[]".utf8)))
                }
                return
            }
            let noReply = message.flags.contains(.noReply)
            guard configuration.includeDocuments else {
                // "[]": none of the revisions is wanted (metadata only); answered once the relay confirmed them.
                let replies = noReply ? [] : [Reply(number: message.number, body: Array("[]".utf8))]
                try await hand(Delivery(generation: session.generation, changes: changes, replies: replies))
                return
            }
            // `[]` per entry: no known ancestors, send every revision; the `rev` messages are answered on confirm.
            if !noReply {
                let wanted = JSONValue.array(changes.map { _ in .array([]) }).jsonString
                try session.send(BLIPMessage(type: .response, number: message.number, body: Array(wanted.utf8)))
            }
            var missing: [String: Int] = [:]
            for (index, change) in changes.enumerated() {
                missing[(change.id ?? "") + "\u{0}" + (change.extra["rev"]?.stringValue ?? "")] = index
            }
            awaitingRevisions.append(
                AwaitingRevisions(
                    delivery: Delivery(generation: session.generation, changes: changes, replies: []), missing: missing)
            )
        case .request where message.profile == "rev" || message.profile == "norev":
            try await received(revision: message, session: session)
        case .request:
            if !message.flags.contains(.noReply) {
                try session.send(
                    BLIPMessage(
                        type: .error, number: message.number,
                        properties: [("Error-Domain", "BLIP"), ("Error-Code", "404")],
                        body: Array("no handler for \(message.profile ?? "a request without Profile")".utf8)))
            }
        case .error where message.number == session.subscription?.number:
            let since = session.subscription?.since
            guard let since, since != "0" else {
                throw RelayError(.blipProtocol, "Sync Gateway refused subChanges: \(message.errorDescription)")
            }
            let reason =
                "Sync Gateway refused subChanges since=\(since) (\(message.errorDescription)); resyncing from since=0"
            logger.error(
                "unknown position: FULL RESYNC from since=0", metadata: metadata(["pubsub.relay.reason": "\(reason)"]))
            pendingResync = Resync(reason: reason)
            resyncing = true
            feed.resume(from: nil)
            try subscribe(session, since: nil)
        case .error:
            logger.warning(
                "Sync Gateway answered with an error",
                metadata: metadata([
                    "pubsub.relay.error": "\(message.errorDescription)"
                ]))
        default:
            break
        }
    }

    /// A `rev` (document body) or `norev` for an entry of a `changes` message; complete messages go to the relay in
    /// the order their `changes` came.
    private func received(revision message: BLIPMessage, session: BLIPSession) async throws {
        let key = (message["id"] ?? "") + "\u{0}" + (message["rev"] ?? "")
        guard let slot = awaitingRevisions.firstIndex(where: { $0.missing[key] != nil }) else {
            throw RelayError(
                .blipProtocol,
                "\(message.profile ?? "rev") for \(message["id"] ?? "?") \(message["rev"] ?? "?") that was not asked for"
            )
        }
        let index = awaitingRevisions[slot].missing.removeValue(forKey: key)!
        if message.profile == "rev" {
            let document: JSONValue
            do { document = try JSONParser().parse(message.body) } catch {
                throw RelayError(.blipProtocol, "the body of rev \(message["id"] ?? "?") is not JSON: \(error)")
            }
            awaitingRevisions[slot].delivery.changes[index].document = document.objectValue
        } else if awaitingRevisions[slot].delivery.changes[index].operation != .delete {
            // Sync Gateway no longer has this revision (superseded and its body gone): a later change of the document
            // follows in the feed. Handed out without its body, it would be routed as a document without fields
            // (its audience told `left`), so it is skipped; its position still counts. A tombstone needs no body.
            awaitingRevisions[slot].delivery.skipped.insert(index)
            logger.debug(
                "Sync Gateway sent norev: the change is skipped, a later one of the document follows",
                metadata: metadata([
                    "pubsub.relay.id": "\(message["id"] ?? "?")", "pubsub.relay.rev": "\(message["rev"] ?? "?")",
                    "pubsub.relay.error": "\(message["error"] ?? "?") \(message["reason"] ?? "")",
                ]))
        }
        if !message.flags.contains(.noReply) {
            awaitingRevisions[slot].delivery.replies.append(Reply(number: message.number, body: []))
        }
        while let first = awaitingRevisions.first, first.missing.isEmpty {
            awaitingRevisions.removeFirst()
            try await hand(first.delivery)
        }
    }

    /// `[[seq, docID, revID, deleted?, bodySize?], …]` → changes of the collection `[db]`.
    func parseChanges(_ body: [UInt8]) throws -> [Change] {
        let value: JSONValue
        do { value = try JSONParser().parse(body) } catch {
            throw RelayError(.blipProtocol, "a changes message's body is not JSON: \(error)")
        }
        guard let entries = value.arrayValue else {
            throw RelayError(.blipProtocol, "a changes message's body is not a JSON array")
        }
        return try entries.map { entry in
            guard let fields = entry.arrayValue, fields.count >= 3, !fields[0].isNull,
                let id = fields[1].stringValue, let rev = fields[2].stringValue
            else {
                throw RelayError(
                    .blipProtocol, "bad changes entry \(entry.jsonString): expected [seq, docID, revID, deleted?, …]")
            }
            var deleted = false
            if fields.count > 3 {
                switch fields[3] {
                case .bool(let flag): deleted = flag
                case .number: deleted = (fields[3].integerValue ?? 0) != 0
                default: deleted = false
                }
            }
            let operation: Change.Operation = deleted ? .delete : rev.hasPrefix("1-") ? .insert : .update
            var extra: JSONObject = ["rev": .string(rev)]
            if resyncing { extra["resync"] = .bool(true) }
            return Change(
                collection: [configuration.url.database], id: id, operation: operation,
                seq: fields[0].jsonString, extra: extra)
        }
    }

    private func metadata(_ extra: Logger.Metadata = [:]) -> Logger.Metadata {
        extra.merging(["pubsub.relay.source": "\(sourceID)"]) { new, _ in new }
    }
}

/// One WebSocket connection's sending side: frames are encoded under a lock (the running checksum and the deflate
/// stream follow the send order) and written in that order by one writer task.
// @unchecked: `encoder` and `_subscription` are guarded by `lock`; the rest is immutable.
final class BLIPSession: @unchecked Sendable {
    let generation: UInt64
    private let lock = NIOLock()
    private var encoder: BLIPFrameEncoder
    private let outgoing: AsyncStream<[UInt8]>.Continuation
    private let outbound: WebSocketOutboundWriter
    private var _subscription: (number: UInt64, since: String?)?

    init(
        generation: UInt64, maxFramePayload: Int, outgoing: AsyncStream<[UInt8]>.Continuation,
        outbound: WebSocketOutboundWriter
    ) {
        self.generation = generation
        self.encoder = BLIPFrameEncoder(maxFramePayload: maxFramePayload)
        self.outgoing = outgoing
        self.outbound = outbound
    }

    /// The `subChanges` request in force and the `since` it was sent with.
    var subscription: (number: UInt64, since: String?)? {
        get { lock.withLock { _subscription } }
        set { lock.withLock { _subscription = newValue } }
    }

    /// Queues `message` for sending; a request (number 0) gets the next request number, which is returned.
    @discardableResult
    func send(_ message: BLIPMessage) throws -> UInt64 {
        try lock.withLock {
            var message = message
            if message.type == .request && message.number == 0 { message.number = encoder.nextRequestNumber() }
            for frame in try encoder.frames(for: message) { outgoing.yield(frame) }
            return message.number
        }
    }

    func sendAck(_ type: BLIPFrameType, number: UInt64, received: UInt64) {
        lock.withLock { _ = outgoing.yield(BLIPFrameEncoder.ack(type, number: number, received: received)) }
    }

    func close() async {
        outgoing.finish()
        try? await outbound.close(.normalClosure, reason: nil)
    }
}
