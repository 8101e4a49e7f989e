import AsyncHTTPClient
import Bayeux
import CoreMetrics
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import PubSubCore

/// Settings of the authorization hook (`--auth-hook*`).
public struct HookSettings: Sendable {
    public var url: String
    public var actions: Set<AuthorizationAction>
    /// The whole call, including time spent waiting for a free slot.
    public var timeout: TimeAmount
    /// Calls in flight at once; more wait, up to `maxWaiting`, then are refused at once (fail closed).
    public var maxConcurrent: Int
    public var maxWaiting: Int
    /// How long an answer (allow or deny) is reused for an identical question; zero: never.
    public var cacheTTL: TimeAmount
    public var maxCacheEntries: Int

    public init(
        url: String, actions: Set<AuthorizationAction> = [.subscribe], timeout: TimeAmount = .seconds(2),
        maxConcurrent: Int = 64, maxWaiting: Int = 1024, cacheTTL: TimeAmount = .zero, maxCacheEntries: Int = 10_000
    ) {
        self.url = url
        self.actions = actions
        self.timeout = timeout
        self.maxConcurrent = maxConcurrent
        self.maxWaiting = maxWaiting
        self.cacheTTL = cacheTTL
        self.maxCacheEntries = maxCacheEntries
    }
}

/// Asks the app over HTTP, like Centrifugo's proxy and nchan's `nchan_authorize_request`.
///
/// For each configured action the broker POSTs a JSON object: `action`, `clientId` (absent at a handshake),
/// `channel` (absent at a handshake), `ext`, `user` (or null), `transport`, `remoteAddress`, and `headers`
/// (`cookie`, `authorization`, `origin`, `user-agent` of the request or WebSocket upgrade that carried the
/// message). The app answers 200 `{"allow": true}` (a handshake answer may add `"user": "42"`, which becomes the
/// session's user) or `{"allow": false, "error": "Not your job"}`, which the client sees as
/// `403:/jobs/42:Not your job`. A timeout, another status, an unreadable answer, an unreachable app or a full
/// queue refuse (fail closed: `503:<channel>:Authorization unavailable`), and are logged and counted.
public final class HookAuthorizer: Authorizer {
    public let settings: HookSettings
    let client: HTTPClient
    let logger: Logger
    private let limiter: Limiter
    private let cache: AnswerCache
    private let metrics: Metrics

    public var name: String { "hook" }
    public var actions: Set<AuthorizationAction> { settings.actions }
    public var needsUser: Bool { true }

    public init(
        settings: HookSettings, client: HTTPClient = .shared, logger: Logger = Logger(label: "pubsub.auth.hook")
    ) {
        self.settings = settings
        self.client = client
        self.logger = logger
        self.limiter = Limiter(maxConcurrent: max(1, settings.maxConcurrent), maxWaiting: max(0, settings.maxWaiting))
        self.cache = AnswerCache(maxEntries: settings.maxCacheEntries)
        self.metrics = Metrics()
    }

    public func authorize(_ request: AuthorizationRequest, on loop: any EventLoop)
        -> EventLoopFuture<AuthorizationDecision>
    {
        let channel = request.channel ?? ""
        let cacheKey = settings.cacheTTL > .zero ? Self.cacheKey(request) : nil
        if let cacheKey, let answer = cache[cacheKey, now: .now()] {
            metrics.cached.increment()
            return loop.makeSucceededFuture(Self.decision(answer, channel: channel))
        }
        let body = Self.body(request)
        let deadline = NIODeadline.now() + settings.timeout
        let promise = loop.makePromise(of: AuthorizationDecision.self)
        let started = limiter.acquire { [self] in
            // The slot is ours: the call may still be late if it waited long.
            guard NIODeadline.now() < deadline else {
                self.limiter.release()
                promise.succeed(self.failed(.timeout, request: request, detail: "waited past the timeout"))
                return
            }
            self.call(body, deadline: deadline, on: loop).whenComplete { result in
                self.limiter.release()
                switch result {
                case .success(let answer):
                    if let cacheKey { self.cache.store(answer, for: cacheKey, until: .now() + self.settings.cacheTTL) }
                    (answer.allow ? self.metrics.allowed : self.metrics.denied).increment()
                    promise.succeed(Self.decision(answer, channel: channel))
                case .failure(let failure as Failure):
                    promise.succeed(self.failed(failure, request: request, detail: nil))
                case .failure(let error):
                    promise.succeed(self.failed(.unreachable, request: request, detail: "\(error)"))
                }
            }
        }
        if !started { promise.succeed(failed(.busy, request: request, detail: nil)) }
        return promise.futureResult
    }

    /// The app's answer.
    public struct Answer: Sendable, Equatable {
        public var allow: Bool
        public var user: String?
        public var error: String?
    }

    enum Failure: String, Error {
        case timeout, status, unreadable, unreachable, busy
    }

    static let unavailable = BayeuxError.Code(503, "Authorization unavailable")
    static let refused = BayeuxError.Code(403, "Forbidden")

    static func decision(_ answer: Answer, channel: String) -> AuthorizationDecision {
        if answer.allow { return .allow(user: answer.user) }
        return .deny(BayeuxError(BayeuxError.Code(403, answer.error ?? refused.message), args: [channel]).description)
    }

    private func failed(_ failure: Failure, request: AuthorizationRequest, detail: String?) -> AuthorizationDecision {
        metrics.failures[failure]?.increment()
        var metadata: Logger.Metadata = [
            "pubsub.auth.action": "\(request.action.rawValue)", "pubsub.auth.hook.failure": "\(failure.rawValue)",
        ]
        if let channel = request.channel { metadata["pubsub.channel"] = "\(channel)" }
        if let clientId = request.clientId { metadata["pubsub.client.id"] = "\(clientId)" }
        if let detail { metadata["pubsub.error"] = "\(detail)" }
        logger.warning("authorization hook failed: refused", metadata: metadata)
        return .deny(BayeuxError(Self.unavailable, args: [request.channel ?? ""]).description)
    }

    private func call(_ body: ByteBuffer, deadline: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<Answer> {
        let request: HTTPClient.Request
        do {
            var headers = HTTPHeaders()
            headers.add(name: "Content-Type", value: "application/json")
            headers.add(name: "Accept", value: "application/json")
            request = try HTTPClient.Request(
                url: settings.url, method: .POST, headers: headers, body: .byteBuffer(body))
        } catch {
            return loop.makeFailedFuture(Failure.unreachable)
        }
        // The client runs on its own loops (the server's loops are not its group); the answer hops back.
        return client.execute(request: request, eventLoop: .indifferent, deadline: deadline).hop(to: loop)
            .flatMapErrorThrowing { error in
                if let error = error as? HTTPClientError,
                    error == .deadlineExceeded || error == .readTimeout
                        || error == .connectTimeout
                {
                    throw Failure.timeout
                }
                throw error
            }
            .flatMapThrowing { response in
                guard response.status == .ok else { throw Failure.status }
                guard let answer = response.body.flatMap(Self.parseAnswer) else { throw Failure.unreadable }
                return answer
            }
    }

    /// `{"allow": true|false, "user": "…", "error": "…"}`; anything else is unreadable.
    static func parseAnswer(_ body: ByteBuffer) -> Answer? {
        guard let object = (try? JSONParser(maxDepth: 16).parse(body))?.objectValue,
            case .bool(let allow)? = object["allow"]
        else { return nil }
        var error = object["error"]?.stringValue.map(Self.clean)
        if error?.isEmpty == true { error = nil }
        let user =
            object["user"]?.stringValue
            ?? object["user"].flatMap { value -> String? in
                if case .number(let n) = value { return n }
                return nil
            }
        return Answer(allow: allow, user: user.flatMap { $0.isEmpty ? nil : $0 }, error: error)
    }

    /// The app's text, on one line and not too long for an error string.
    static func clean(_ text: String) -> String {
        let line = String(text.map { $0.isNewline ? " " : $0 })
        return line.count > 200 ? String(line.prefix(200)) : line
    }

    /// The JSON the app receives.
    public static func body(_ request: AuthorizationRequest) -> ByteBuffer {
        var object: JSONObject = ["action": .string(request.action.rawValue)]
        if let clientId = request.clientId { object["clientId"] = .string(clientId) }
        if let channel = request.channel { object["channel"] = .string(channel) }
        object["ext"] = request.message.ext.map { .object($0) } ?? .null
        object["user"] = request.user.map { .string($0) } ?? .null
        object["transport"] = .string(request.context.connectionType.rawValue)
        object["remoteAddress"] = request.context.remoteAddress.map { .string($0) } ?? .null
        var headers = JSONObject()
        for name in RequestContext.forwardedHeaders {
            if let value = request.context.headers[name] { headers[name] = .string(value) }
        }
        object["headers"] = .object(headers)
        var buffer = ByteBuffer()
        buffer.writeJSON(object)
        return buffer
    }

    /// What makes two questions the same for the cache: everything the app is told except the clientId, the
    /// transport, the address and the user-agent (so one user's page reloads hit the cache).
    static func cacheKey(_ request: AuthorizationRequest) -> String {
        var object: JSONObject = ["action": .string(request.action.rawValue)]
        object["channel"] = request.channel.map { .string($0) } ?? .null
        object["user"] = request.user.map { .string($0) } ?? .null
        object["ext"] = request.message.ext.map { .object($0) } ?? .null
        for name in ["cookie", "authorization", "origin"] {
            object[name] = request.context.headers[name].map { .string($0) } ?? .null
        }
        return JSONValue.object(object).jsonString
    }

    /// Calls in flight, bounded; waiters run in arrival order when a call ends.
    final class Limiter: Sendable {
        private struct State {
            var inFlight = 0
            var waiting = CircularBuffer<@Sendable () -> Void>()
        }
        private let state = NIOLockedValueBox(State())
        let maxConcurrent: Int
        let maxWaiting: Int

        init(maxConcurrent: Int, maxWaiting: Int) {
            self.maxConcurrent = maxConcurrent
            self.maxWaiting = maxWaiting
        }

        /// Runs `start` now or when a slot frees; false (and `start` never runs) when the queue is full.
        func acquire(_ start: @escaping @Sendable () -> Void) -> Bool {
            let now = state.withLockedValue { state -> Bool? in
                if state.inFlight < maxConcurrent {
                    state.inFlight += 1
                    return true
                }
                guard state.waiting.count < maxWaiting else { return nil }
                state.waiting.append(start)
                return false
            }
            guard let now else { return false }
            if now { start() }
            return true
        }

        func release() {
            let next = state.withLockedValue { state -> (@Sendable () -> Void)? in
                if let next = state.waiting.popFirst() { return next }  // the slot passes to it
                state.inFlight -= 1
                return nil
            }
            next?()
        }
    }

    /// Answers by question, each until its expiry; bounded (full: emptied, the simplest fair eviction).
    final class AnswerCache: Sendable {
        private let entries = NIOLockedValueBox([String: (Answer, NIODeadline)]())
        let maxEntries: Int

        init(maxEntries: Int) { self.maxEntries = maxEntries }

        subscript(key: String, now now: NIODeadline) -> Answer? {
            entries.withLockedValue { entries in
                guard let (answer, until) = entries[key] else { return nil }
                if now >= until {
                    entries[key] = nil
                    return nil
                }
                return answer
            }
        }

        func store(_ answer: Answer, for key: String, until: NIODeadline) {
            entries.withLockedValue { entries in
                if entries.count >= maxEntries { entries.removeAll(keepingCapacity: true) }
                entries[key] = (answer, until)
            }
        }
    }

    struct Metrics: Sendable {
        let allowed = Counter(label: "pubsub_auth_hook_answers_total", dimensions: [("answer", "allow")])
        let denied = Counter(label: "pubsub_auth_hook_answers_total", dimensions: [("answer", "deny")])
        let cached = Counter(label: "pubsub_auth_hook_cache_hits_total")
        let failures: [Failure: Counter] = Dictionary(
            uniqueKeysWithValues: [Failure.timeout, .status, .unreadable, .unreachable, .busy].map {
                ($0, Counter(label: "pubsub_auth_hook_failures_total", dimensions: [("reason", $0.rawValue)]))
            })
    }
}
