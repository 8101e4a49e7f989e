import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL

/// A Bayeux client, as Faye's: handshake, a connect loop that follows the server's advice, subscriptions that
/// survive a re-handshake, publishing (one message, or many pipelined), and disconnect. Speaks long-polling
/// over HTTP/1.1 or WebSocket.
///
///     let client = try BayeuxClient(url: "http://127.0.0.1:9292/faye")
///     try await client.subscribe("/chat/room")
///     try await client.publish("/chat/room", data: ["text": "hi"])
///     for try await message in client.events { print(message.data!) }
///
/// Publishing needs no handshake (like PrivatePub's `publish_to`); subscribing handshakes first if needed.
public actor BayeuxClient {
    public struct Configuration: Sendable {
        public enum Transport: Sendable, Equatable {
            /// WebSocket for `ws://` URLs, long-polling for `http://`.
            case automatic
            case longPolling
            case webSocket
        }

        public var transport: Transport
        /// How long to wait for a TCP connection (and a WebSocket upgrade).
        public var connectTimeout: TimeAmount
        /// How long to wait for the answer to anything but a held `/meta/connect`.
        public var requestTimeout: TimeAmount
        /// How often a request answered `429 Too Many Requests` is retried before giving up.
        public var maxRateLimitRetries: Int
        /// The longest `Retry-After` honoured, in seconds (longer advice is cut to this).
        public var maxRetryAfter: Double
        /// Largest WebSocket message accepted from the server.
        public var maxFrameBytes: Int
        /// Messages per request when publishing many.
        public var batchSize: Int
        /// Requests outstanding at once when publishing many.
        public var pipelineDepth: Int
        /// Pause before the next connect after one failed on the network.
        public var retryDelay: TimeAmount
        /// Consecutive failed connects after which `events` ends with the error; nil retries forever, as Faye.
        public var maxConnectFailures: Int?
        /// `ext` sent with every handshake.
        public var handshakeExt: JSONObject?
        /// Called for every subscribe, also the ones repeated after a re-handshake, to produce its `ext`
        /// (a fresh signature, bound to the current clientId if the scheme wants it).
        public var subscriptionExt: (@Sendable (_ channel: String, _ clientId: String) -> JSONObject?)?
        /// For `https`/`wss`: a PEM file of the certificate authorities to trust instead of the system's.
        public var trustRoots: String?
        /// Called with the server's error when it ended the session (an unknown client after expiry, a queue
        /// overflow of a consumer too slow for the publish rate) just before the client handshakes again and
        /// repeats its subscriptions: events published in between may be missing.
        public var onSessionLost: (@Sendable (_ error: String) -> Void)?
        /// Called once per outage when the connection that carries events broke while the session lives (a
        /// connect failed on the network or timed out, a WebSocket closed): events in flight may be lost, and
        /// with `resume` the client asks for them on its next connect.
        public var onConnectionLost: (@Sendable (_ error: String) -> Void)?
        /// Resume with positions (docs/PROTOCOL.md): every subscribe sends `ext.resume`, from the position the
        /// caller gives or else the handshake's, so that nothing published after that point is missed; after any
        /// reconnect (a broken connection on the same session, or a new session) each subscription is repeated
        /// from the position of the last message received on it, and `onResumed` says whether the broker still
        /// held everything since. Needs a broker that gives positions (pubsub with history on); with any other,
        /// subscriptions are repeated without after a new session, and not at all on the same one.
        public var resume: Bool
        /// Called after a reconnect for each subscription repeated with `ext.resume`, with the broker's answer:
        /// `recovered` false means events were lost in between.
        public var onResumed: (@Sendable (_ channel: String, _ outcome: ResumeOutcome) -> Void)?

        public init(
            transport: Transport = .automatic,
            connectTimeout: TimeAmount = .seconds(3),
            requestTimeout: TimeAmount = .seconds(10),
            maxRateLimitRetries: Int = 5,
            maxRetryAfter: Double = 30,
            maxFrameBytes: Int = 1 << 24,
            batchSize: Int = 100,
            pipelineDepth: Int = 8,
            retryDelay: TimeAmount = .seconds(1),
            maxConnectFailures: Int? = nil,
            handshakeExt: JSONObject? = nil,
            subscriptionExt: (@Sendable (_ channel: String, _ clientId: String) -> JSONObject?)? = nil
        ) {
            self.transport = transport
            self.connectTimeout = connectTimeout
            self.requestTimeout = requestTimeout
            self.maxRateLimitRetries = maxRateLimitRetries
            self.maxRetryAfter = maxRetryAfter
            self.maxFrameBytes = maxFrameBytes
            self.batchSize = batchSize
            self.pipelineDepth = pipelineDepth
            self.retryDelay = retryDelay
            self.maxConnectFailures = maxConnectFailures
            self.handshakeExt = handshakeExt
            self.subscriptionExt = subscriptionExt
            self.trustRoots = nil
            self.onSessionLost = nil
            self.onConnectionLost = nil
            self.resume = false
            self.onResumed = nil
        }
    }

    /// The broker's answer to a subscribe with `ext.resume`.
    public struct ResumeOutcome: Sendable, Hashable {
        /// Every message published after the position on a matching channel was still held, and is delivered
        /// (in order, before anything newer).
        public var recovered: Bool
        /// How many (when recovered; otherwise the number still held, a lower bound, 0 when unknown).
        public var missed: Int

        public init(recovered: Bool, missed: Int) {
            self.recovered = recovered
            self.missed = missed
        }

        /// The answer in a successful subscribe reply's `ext.resume`; nil when it has none (a broker without
        /// positions).
        init?(reply: Message) {
            guard reply["successful"] == .bool(true), let answer = reply.ext?["resume"]?.objectValue,
                case .bool(let recovered)? = answer["recovered"]
            else { return nil }
            self.init(recovered: recovered, missed: Int(answer["missed"]?.integerValue ?? 0))
        }
    }

    /// One message to publish.
    public struct Publication: Sendable {
        public var channel: String
        public var data: JSONValue
        public var ext: JSONObject?

        public init(channel: String, data: JSONValue, ext: JSONObject? = nil) {
            self.channel = channel
            self.data = data
            self.ext = ext
        }
    }

    /// What the server said to one publication.
    public struct PublishResult: Sendable, Equatable {
        public var successful: Bool
        /// The server's `error` string when it refused.
        public var error: String?
    }

    public nonisolated let url: BayeuxURL
    public nonisolated let configuration: Configuration
    /// Messages delivered to this client's subscriptions, in arrival order. Ends after `disconnect()`, or with
    /// an error when the session cannot be kept (advice `none`, a refused re-subscription, too many failures).
    public nonisolated let events: AsyncThrowingStream<Message, any Error>

    private let eventSink: AsyncThrowingStream<Message, any Error>.Continuation
    /// With `configuration.resume`: the position of the last message received on each subscription, recorded
    /// before the message is handed to `events`, so that a repeated subscription resumes right after it; and the
    /// positions of the last messages handed on, so that one the broker sends again is not handed on twice.
    private nonisolated let received: NIOLockedValueBox<DeliveryLog>
    /// The position the last handshake reply gave (`ext.position`), if the broker gives positions.
    public private(set) var handshakePosition: String?
    private let transport: any BayeuxTransport
    public private(set) var clientId: String?
    private var subscriptions: [(channel: String, ext: JSONObject?)] = []
    private var connectTask: Task<Void, Never>?
    private var nextId = 0
    private var adviceTimeout: TimeAmount = .seconds(45)
    private var adviceInterval: TimeAmount = .zero
    private var adviceReconnect = "retry"
    private var closed = false
    /// The connection broke since the last connect: the next one resumes every subscription first.
    private var reconnecting = false
    private let group: any EventLoopGroup

    public init(
        url: String, configuration: Configuration = .init(),
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) throws {
        let parsed = try BayeuxURL(url)
        self.url = parsed
        self.configuration = configuration
        let (stream, continuation) = AsyncThrowingStream<Message, any Error>.makeStream()
        self.events = stream
        self.eventSink = continuation
        let received = NIOLockedValueBox(DeliveryLog(tracksPositions: configuration.resume))
        self.received = received
        self.group = group
        let onEvents: @Sendable ([Message]) -> Void = { events in
            for event in events where received.withLockedValue({ $0.accept(event) }) {
                continuation.yield(event)
            }
        }
        let useWebSocket =
            configuration.transport == .webSocket
            || (configuration.transport == .automatic && parsed.prefersWebSocket)
        let tls = parsed.secure ? try Self.tlsContext(trustRoots: configuration.trustRoots) : nil
        if useWebSocket {
            transport = WebSocketTransport(
                url: parsed, group: group, configuration: configuration, tls: tls, onEvents: onEvents)
        } else {
            transport = HTTPTransport(
                url: parsed, group: group, configuration: configuration, tls: tls, onEvents: onEvents)
        }
    }

    /// TLS for `https`/`wss`: the server's certificate must chain to `trustRoots` (or the system's roots) and name
    /// the URL's host (or address).
    private static func tlsContext(trustRoots: String?) throws(BayeuxClientError) -> NIOSSLContext {
        var tls = TLSConfiguration.makeClientConfiguration()
        if let trustRoots { tls.trustRoots = .file(trustRoots) }
        do {
            return try NIOSSLContext(configuration: tls)
        } catch {
            throw BayeuxClientError(
                .invalidURL, "cannot set up TLS\(trustRoots.map { " with \($0)" } ?? ""): \(describe(error))")
        }
    }

    /// The `connectionType` in use: `long-polling` or `websocket`.
    public nonisolated var connectionType: String { transport.connectionType.rawValue }

    private func makeId() -> JSONValue {
        nextId += 1
        return .string(String(nextId, radix: 36))
    }

    // MARK: Session

    /// Handshakes (if not done yet) and starts the connect loop; returns the clientId.
    @discardableResult
    public func handshake() async throws -> String {
        if let clientId { return clientId }
        let id = try await performHandshake()
        startConnectLoop()
        return id
    }

    private func performHandshake() async throws -> String {
        guard !closed else { throw BayeuxClientError(.notConnected, "the client is closed") }
        var message = Message()
        message.channel = Channel.handshake
        message["version"] = "1.0"
        message["supportedConnectionTypes"] = .array([.string(transport.connectionType.rawValue)])
        message["id"] = makeId()
        if let ext = configuration.handshakeExt { message.ext = ext }
        let reply = try await roundTrip(message, timeout: configuration.requestTimeout)
        guard reply["successful"] == .bool(true), let id = reply.clientId else {
            throw BayeuxClientError(.refused, reply.error ?? "handshake refused")
        }
        applyAdvice(reply)
        clientId = id
        handshakePosition = reply.ext?["position"]?.stringValue
        return id
    }

    private func applyAdvice(_ reply: Message) {
        guard let advice = reply["advice"]?.objectValue else { return }
        if let t = advice["timeout"]?.doubleValue, t >= 0 { adviceTimeout = .nanoseconds(Int64(t * 1_000_000)) }
        if let i = advice["interval"]?.doubleValue, i >= 0 { adviceInterval = .nanoseconds(Int64(i * 1_000_000)) }
        if let r = advice["reconnect"]?.stringValue { adviceReconnect = r }
    }

    private func startConnectLoop() {
        connectTask?.cancel()
        connectTask = Task { await self.connectLoop() }
    }

    private func connectLoop() async {
        var failures = 0
        while !Task.isCancelled, !closed {
            do {
                // A re-handshake that failed on the network left no session: try it again.
                guard let clientId else {
                    try await rehandshake()
                    continue
                }
                if transport.takeInterruption() { connectionLost("the WebSocket closed") }
                var message = Message()
                message.channel = Channel.connect
                message.clientId = clientId
                message["connectionType"] = .string(transport.connectionType.rawValue)
                message["id"] = makeId()
                let reply =
                    try await reconnecting
                    ? resumeThenConnect(message, clientId: clientId)
                    : roundTrip(message, timeout: adviceTimeout + configuration.requestTimeout)
                failures = 0
                applyAdvice(reply)
                if reply["successful"] == .bool(true) {
                    if adviceInterval > .zero { try await sleep(adviceInterval) }
                    continue
                }
                switch adviceReconnect {
                case "none":
                    finish(BayeuxClientError(.refused, reply.error ?? "the server ended the session"))
                    return
                case "retry":
                    try await sleep(max(adviceInterval, configuration.retryDelay))
                default:
                    configuration.onSessionLost?(reply.error ?? "the server ended the session")
                    try await rehandshake()
                }
            } catch {
                if Task.isCancelled || closed { return }
                if let e = error as? BayeuxClientError, e.code == .refused {
                    finish(e)
                    return
                }
                connectionLost(describe(error))
                failures += 1
                if let limit = configuration.maxConnectFailures, failures >= limit {
                    finish(error)
                    return
                }
                try? await sleep(configuration.retryDelay)
            }
        }
    }

    /// A connect failed on the network, or the WebSocket closed: the next connect is a reconnect.
    private func connectionLost(_ why: String) {
        guard !reconnecting else { return }
        reconnecting = true
        configuration.onConnectionLost?(why)
    }

    /// The first connect after a reconnect on the same session. With `configuration.resume`, every subscription is
    /// repeated with `ext.resume` from the position of the last message received on it, in the same frame or request
    /// as the connect and before it: the broker queues what was missed before anything newer, and drops from the
    /// session's queue what that range covers. A message that still comes twice is dropped by its position.
    private func resumeThenConnect(_ connect: Message, clientId: String) async throws -> Message {
        let connectTimeout = adviceTimeout + configuration.requestTimeout
        let resumes: [(channel: String, from: String, message: Message)] =
            configuration.resume
            ? subscriptions.compactMap { channel, ext in
                guard let from = received.withLockedValue({ $0.positions[channel: channel] }) else { return nil }
                let ext = configuration.subscriptionExt?(channel, clientId) ?? ext
                return (channel, from, subscribeMessage(channel, clientId: clientId, ext: ext, resume: from))
            }
            : []
        guard !resumes.isEmpty else {
            let reply = try await roundTrip(connect, timeout: connectTimeout)
            reconnecting = false
            return reply
        }
        let pending = try await transport.exchange(
            groups: [resumes.map(\.message), [connect]], timeouts: [configuration.requestTimeout, connectTimeout])
        let replies = try await pending[0].get()
        reconnecting = false
        for (channel, from, message) in resumes {
            let reply = replies.first { $0.id == message.id }
            let outcome: ResumeOutcome
            if let reply, reply["successful"] == .bool(true) {
                guard let answer = ResumeOutcome(reply: reply) else { continue }  // a broker without positions
                outcome = answer
            } else if reply?.error?.hasPrefix("401:") == true {
                continue  // the session is gone: the connect is told so, and the new session resumes
            } else {
                outcome = ResumeOutcome(recovered: false, missed: 0)  // refused: nothing is known to be coming
            }
            if !outcome.recovered {
                let now = await positionNow()
                startOver(channel, from: from, now: now)
            }
            configuration.onResumed?(channel, outcome)
        }
        guard let reply = try await pending[1].get().first(where: { $0.id == connect.id }) else {
            throw BayeuxClientError(.protocolError, "no reply to \(Channel.connect) from the server")
        }
        return reply
    }

    /// The broker's position now: the handshake of a session made for that and ended at once tells it. Nil when it
    /// cannot be had (the broker gives no positions, or is not reachable). Internal for the tests.
    func positionNow() async -> String? {
        var probing = configuration
        probing.resume = false
        probing.onSessionLost = nil
        probing.onConnectionLost = nil
        probing.onResumed = nil
        guard let probe = try? BayeuxClient(url: url.description, configuration: probing, group: group) else {
            return nil
        }
        _ = try? await probe.performHandshake()
        let position = await probe.handshakePosition
        await probe.disconnect()
        return position
    }

    /// A new session after the server forgot the old one: handshake again, then repeat every subscription.
    private func rehandshake() async throws {
        clientId = nil
        let id = try await performHandshake()
        do {
            for (channel, ext) in subscriptions {
                let from = configuration.resume ? received.withLockedValue { $0.positions[channel: channel] } : nil
                let outcome = try await sendSubscribe(
                    channel, clientId: id, ext: configuration.subscriptionExt?(channel, id) ?? ext, resume: from)
                if let outcome {
                    if !outcome.recovered { startOver(channel, from: from, now: handshakePosition) }
                    configuration.onResumed?(channel, outcome)
                }
            }
            // Every subscription resumed with the new session, also past a socket closed with the old one.
            reconnecting = false
            _ = transport.takeInterruption()
        } catch let error as BayeuxClientError where error.code == .refused {
            throw error
        } catch {
            clientId = nil  // not every subscription is back: start over with a new session
            throw error
        }
    }

    private func sleep(_ amount: TimeAmount) async throws {
        try await Task.sleep(nanoseconds: UInt64(max(0, amount.nanoseconds)))
    }

    private func finish(_ error: (any Error)?) {
        eventSink.finish(throwing: error)
    }

    // MARK: Subscriptions

    /// Subscribes to a channel or pattern; returns once the server accepted it. A refusal throws `.refused`
    /// with the server's error. `ext` (for instance a PrivatePub signature) is sent with the subscribe; without
    /// it, `configuration.subscriptionExt` is asked.
    ///
    /// With `configuration.resume`, the subscribe resumes from `resumeFrom` (a position kept from an earlier
    /// run), or else from the handshake's position, and the broker's answer is returned: the messages it
    /// recovered arrive on `events` first. Nil when nothing was resumed (the broker gives no positions).
    @discardableResult
    public func subscribe(_ channel: String, ext: JSONObject? = nil, resumeFrom: String? = nil) async throws
        -> ResumeOutcome?
    {
        let id = try await handshake()
        let from = configuration.resume ? (resumeFrom ?? handshakePosition) : nil
        if let from { received.withLockedValue { $0.positions[channel: channel] = from } }
        let outcome = try await sendSubscribe(
            channel, clientId: id, ext: ext ?? configuration.subscriptionExt?(channel, id), resume: from)
        if let outcome, !outcome.recovered { startOver(channel, from: from, now: handshakePosition) }
        subscriptions.append((channel, ext))
        return outcome
    }

    /// After `recovered: false` the subscription continues from the broker's position `now` (the handshake's of a
    /// new session), unless a message received meanwhile already moved it on.
    private func startOver(_ channel: String, from: String?, now: String?) {
        guard let now else { return }
        received.withLockedValue { log in
            if log.positions[channel: channel] == from { log.positions[channel: channel] = now }
        }
    }

    /// The position of the last message received on each subscription (with `configuration.resume`).
    public nonisolated var receivedPositions: SubscriptionPositions { received.withLockedValue { $0.positions } }

    private func sendSubscribe(_ channel: String, clientId: String, ext: JSONObject?, resume: String? = nil)
        async throws -> ResumeOutcome?
    {
        let reply = try await roundTrip(
            subscribeMessage(channel, clientId: clientId, ext: ext, resume: resume),
            timeout: configuration.requestTimeout)
        guard reply["successful"] == .bool(true) else {
            throw BayeuxClientError(.refused, reply.error ?? "subscription to \(channel) refused")
        }
        return resume == nil ? nil : ResumeOutcome(reply: reply)
    }

    private func subscribeMessage(_ channel: String, clientId: String, ext: JSONObject?, resume: String?) -> Message {
        var message = Message()
        message.channel = Channel.subscribe
        message.clientId = clientId
        message["subscription"] = .string(channel)
        message["id"] = makeId()
        if let ext { message.ext = ext }
        if let resume {
            var ext = message.ext ?? JSONObject()
            ext["resume"] = .string(resume)
            message.ext = ext
        }
        return message
    }

    public func unsubscribe(_ channel: String) async throws {
        subscriptions.removeAll { $0.channel == channel }
        received.withLockedValue { $0.positions[channel: channel] = nil }
        guard let clientId else { return }
        var message = Message()
        message.channel = Channel.unsubscribe
        message.clientId = clientId
        message["subscription"] = .string(channel)
        message["id"] = makeId()
        let reply = try await roundTrip(message, timeout: configuration.requestTimeout)
        guard reply["successful"] == .bool(true) else {
            throw BayeuxClientError(.refused, reply.error ?? "unsubscribe from \(channel) refused")
        }
    }

    // MARK: Publishing

    /// Publishes one message and returns once the server acknowledged it; a refusal throws `.refused` with the
    /// server's error string.
    public func publish(_ channel: String, data: JSONValue, ext: JSONObject? = nil) async throws {
        let reply = try await roundTrip(
            publication(Publication(channel: channel, data: data, ext: ext)),
            timeout: configuration.requestTimeout)
        guard reply["successful"] == .bool(true) else {
            throw BayeuxClientError(.refused, reply.error ?? "publish to \(channel) refused")
        }
    }

    /// Publishes many messages in order, `batchSize` per request with up to `pipelineDepth` requests in
    /// flight, and returns what the server said to each. Throws only when the exchange itself failed (then
    /// some of them may have been delivered).
    public func publish(_ publications: [Publication]) async throws -> [PublishResult] {
        let messages = publications.map(publication)
        let size = max(1, configuration.batchSize)
        let batches = stride(from: 0, to: messages.count, by: size).map {
            Array(messages[$0..<min($0 + size, messages.count)])
        }
        let replies = try await transport.exchangePipelined(
            batches, window: configuration.pipelineDepth, timeout: configuration.requestTimeout)
        var byId: [JSONValue: Message] = [:]
        for batch in replies { for reply in batch { if let id = reply.id { byId[id] = reply } } }
        return messages.map { message in
            guard let reply = byId[message.id!] else {
                return PublishResult(successful: false, error: "no reply from the server")
            }
            let ok = reply["successful"] == .bool(true)
            return PublishResult(successful: ok, error: ok ? nil : (reply.error ?? "refused"))
        }
    }

    private func publication(_ p: Publication) -> Message {
        var message = Message()
        message.channel = p.channel
        message["data"] = p.data
        message["id"] = makeId()
        if let clientId { message.clientId = clientId }
        if let ext = p.ext { message.ext = ext }
        return message
    }

    // MARK: Ending

    /// Ends the session: stops the connect loop, sends `/meta/disconnect` (without waiting long for the
    /// answer), closes the connections and ends `events`.
    public func disconnect() async {
        connectTask?.cancel()
        connectTask = nil
        if let clientId, !closed {
            var message = Message()
            message.channel = Channel.disconnect
            message.clientId = clientId
            message["id"] = makeId()
            _ = try? await transport.exchange([message], timeout: .seconds(2))
        }
        self.clientId = nil
        await close()
    }

    /// Closes the connections without telling the server; the session expires there on its own.
    public func close() async {
        closed = true
        connectTask?.cancel()
        connectTask = nil
        await transport.close()
        finish(nil)
    }

    // MARK: Exchange

    private func roundTrip(_ message: Message, timeout: TimeAmount) async throws -> Message {
        let replies = try await transport.exchange([message], timeout: timeout)
        guard let reply = replies.first(where: { $0.id == message.id }) else {
            throw BayeuxClientError(.protocolError, "no reply to \(message.channel ?? "the message") from the server")
        }
        return reply
    }
}
