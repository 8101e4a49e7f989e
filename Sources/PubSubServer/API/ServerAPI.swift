import Bayeux
import CoreMetrics
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import PubSubCore

/// The server API (`/api/*`) and the dashboard page (`/admin`): another transport of the same server, served on
/// the broker's port and on the metrics port. Every answer is JSON; every error is `{"error": "…"}` with a 4xx.
/// Without a configured key both answer 404; a request without the right `Authorization: apikey KEY` gets 401.
struct ServerAPI: Sendable {
    struct Response: Sendable {
        var status: HTTPResponseStatus
        var headers: HTTPHeaders
        var body: ByteBuffer
    }

    let key: String?
    let broker: Broker
    /// The engine as it answers `channels`, `presence`, `history` and `info`; nil: those calls answer 501.
    let queries: (any EngineQueries)?
    let rates: APIRates
    let nodeID: String
    let startedAt: NIODeadline
    let maxJSONDepth: Int
    let errors: RecentErrors
    /// Failed authentications by address (`APIAuthFailures`), and what they are counted in.
    let authFailures: NIOLockedValueBox<APIAuthFailures>
    let metrics: ServerMetrics?

    init(
        key: String?, broker: Broker, rates: APIRates, nodeID: String, startedAt: NIODeadline, maxJSONDepth: Int,
        errors: RecentErrors, authFailures: APIAuthFailures.Settings = .init(), metrics: ServerMetrics? = nil
    ) {
        self.key = key
        self.broker = broker
        self.queries = broker.engine as? any EngineQueries
        self.rates = rates
        self.nodeID = nodeID
        self.startedAt = startedAt
        self.maxJSONDepth = maxJSONDepth
        self.errors = errors
        self.authFailures = NIOLockedValueBox(APIAuthFailures(settings: authFailures))
        self.metrics = metrics
    }

    /// Answers `/api/<call>`; the body has been read (and bounded) by the transport. `address` is the client's
    /// (the last `X-Forwarded-For` hop behind a trusted proxy), for the bound on failed authentications.
    func respond(call: String, head: HTTPRequestHead, body: ByteBuffer?, address: String?, on loop: any EventLoop)
        -> EventLoopFuture<Response>
    {
        guard let key else { return loop.makeSucceededFuture(Self.notFound) }
        let now = NIODeadline.now()
        let address = address ?? "?"
        if case .throttled(let retryAfter) = authFailures.withLockedValue({ $0.check(address, now: now) }) {
            metrics?.apiAuthThrottled.increment()
            var response = Self.error(
                .tooManyRequests, "too many failed API authentications from this address: retry in \(retryAfter) s")
            response.headers.add(name: "Retry-After", value: String(retryAfter))
            return loop.makeSucceededFuture(response)
        }
        guard Self.authorized(head.headers, key: key) else {
            authFailures.withLockedValue { $0.failed(address, now: now) }
            metrics?.apiAuthFailures.increment()
            var response = Self.error(.unauthorized, "missing or wrong API key (Authorization: apikey KEY)")
            response.headers.add(name: "WWW-Authenticate", value: "apikey")
            return loop.makeSucceededFuture(response)
        }
        // An engine that fails (Redis lost in the middle of a call) is answered, never left without a response.
        return answer(call: call, head: head, body: body, on: loop).recover { error in
            Self.error(.serviceUnavailable, "the engine could not answer: \(error)")
        }
    }

    private func answer(call: String, head: HTTPRequestHead, body: ByteBuffer?, on loop: any EventLoop)
        -> EventLoopFuture<Response>
    {
        let query = Query(uri: head.uri)
        let now = NIODeadline.now()
        let method = head.method == .HEAD ? .GET : head.method
        switch (call, method) {
        case ("publish", .POST): return publish(body, now: now, on: loop)
        case ("broadcast", .POST): return broadcast(body, now: now, on: loop)
        case ("disconnect", .POST): return disconnect(body, on: loop)
        case ("channels", .GET), ("presence", .GET), ("history", .GET), ("info", .GET):
            guard let queries else { return loop.makeSucceededFuture(Self.notAnswered) }
            switch call {
            case "channels": return channels(query, queries: queries, on: loop)
            case "presence": return presence(query, queries: queries, now: now, on: loop)
            case "history": return history(query, queries: queries, now: now, on: loop)
            default: return info(queries: queries, on: loop)
            }
        case ("rates", .GET): return loop.makeSucceededFuture(Self.json(.ok, rates.seriesJSON()))
        case ("errors", .GET): return loop.makeSucceededFuture(Self.json(.ok, errors.json()))
        case ("publish", _), ("broadcast", _), ("disconnect", _):
            return loop.makeSucceededFuture(Self.methodNotAllowed("POST"))
        case ("channels", _), ("presence", _), ("history", _), ("info", _), ("rates", _), ("errors", _):
            return loop.makeSucceededFuture(Self.methodNotAllowed("GET, HEAD"))
        default:
            return loop.makeSucceededFuture(Self.error(.notFound, "no such call"))
        }
    }

    /// A name for this node in `/api/info` (a clustered engine reports its own node id instead).
    static func makeNodeID() -> String { String(ClientID.random().prefix(12)) }

    /// Constant time in the key's content: every byte of the longer of the two is looked at.
    static func authorized(_ headers: HTTPHeaders, key: String) -> Bool {
        guard let value = headers.first(name: "authorization") else { return false }
        let scheme = "apikey "
        guard value.count > scheme.count, value.prefix(scheme.count).lowercased() == scheme else { return false }
        let given = value.dropFirst(scheme.count).drop(while: { $0 == " " })
        return constantTimeEqual(String(given), key)
    }

    // MARK: Calls

    private func publish(_ body: ByteBuffer?, now: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<Response> {
        let object: JSONObject
        switch parseObject(body) {
        case .failure(let problem): return loop.makeSucceededFuture(problem.response)
        case .success(let o): object = o
        }
        guard let channel = object["channel"]?.stringValue else {
            return loop.makeSucceededFuture(Self.error(.badRequest, "channel must be a string"))
        }
        guard let data = object["data"], !data.isNull else {
            return loop.makeSucceededFuture(Self.error(.badRequest, "data is missing"))
        }
        return broker.publishFromAPI(channel: channel, data: data, ext: object["ext"], now: now, on: loop).map {
            switch $0 {
            case .failure(let problem): return Self.error(.badRequest, problem.message)
            case .success(let position):
                return Self.json(.ok, .object(["position": position.map(JSONValue.string) ?? .null]))
            }
        }.flatMapErrorThrowing { error in
            guard let refused = error as? PublishRefused else { throw error }
            var response = Self.error(.serviceUnavailable, refused.reason)
            response.headers.add(name: "Retry-After", value: "1")
            return response
        }
    }

    private func broadcast(_ body: ByteBuffer?, now: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<Response> {
        let object: JSONObject
        switch parseObject(body) {
        case .failure(let problem): return loop.makeSucceededFuture(problem.response)
        case .success(let o): object = o
        }
        guard let list = object["channels"]?.arrayValue, !list.isEmpty else {
            return loop.makeSucceededFuture(Self.error(.badRequest, "channels must be a non-empty array"))
        }
        let channels = list.compactMap(\.stringValue)
        guard channels.count == list.count else {
            return loop.makeSucceededFuture(Self.error(.badRequest, "channels must be strings"))
        }
        guard channels.count <= broker.configuration.maxMessagesPerRequest else {
            return loop.makeSucceededFuture(
                Self.error(.badRequest, "too many channels (limit \(broker.configuration.maxMessagesPerRequest))"))
        }
        guard let data = object["data"], !data.isNull else {
            return loop.makeSucceededFuture(Self.error(.badRequest, "data is missing"))
        }
        // Every channel is checked before anything is published: a broadcast is refused whole or sent whole.
        for channel in channels {
            if let problem = broker.validatePublishChannel(channel) {
                return loop.makeSucceededFuture(Self.error(.badRequest, "\(channel): \(problem.message)"))
            }
        }
        let ext = object["ext"]
        var future = loop.makeSucceededFuture([JSONValue]())
        for channel in channels {
            future = future.flatMap { results in
                // A refused publish is this channel's error: the ones before it were published, and a retry of
                // the whole broadcast would send them twice.
                self.broker.publishFromAPI(channel: channel, data: data, ext: ext, now: now, on: loop)
                    .flatMapErrorThrowing { error -> Result<String?, Broker.APIPublishError> in
                        switch error {
                        case let refused as PublishRefused:
                            return .failure(Broker.APIPublishError(message: refused.reason))
                        case let uncertain as PublishUncertain:
                            return .failure(Broker.APIPublishError(message: uncertain.reason))
                        default: throw error
                        }
                    }.map { outcome in
                        var results = results
                        switch outcome {
                        case .success(let position):
                            results.append(
                                .object([
                                    "channel": .string(channel), "position": position.map(JSONValue.string) ?? .null,
                                ]))
                        case .failure(let problem):
                            results.append(.object(["channel": .string(channel), "error": .string(problem.message)]))
                        }
                        return results
                    }
            }
        }
        return future.map { Self.json(.ok, .object(["results": .array($0)])) }
    }

    private func disconnect(_ body: ByteBuffer?, on loop: any EventLoop) -> EventLoopFuture<Response> {
        let object: JSONObject
        switch parseObject(body) {
        case .failure(let problem): return loop.makeSucceededFuture(problem.response)
        case .success(let o): object = o
        }
        guard let clientId = object["clientId"]?.stringValue, !clientId.isEmpty else {
            return loop.makeSucceededFuture(Self.error(.badRequest, "clientId must be a string"))
        }
        return broker.kick(clientId, on: loop).map { Self.json(.ok, .object(["disconnected": .bool($0)])) }
    }

    private func channels(_ query: Query, queries: any EngineQueries, on loop: any EventLoop) -> EventLoopFuture<
        Response
    > {
        let pattern = query["pattern"]
        if let pattern, !Channel.isValidNameOrPattern(pattern) {
            return loop.makeSucceededFuture(Self.error(.badRequest, "invalid pattern"))
        }
        return queries.channels(on: loop).map { counts in
            let selected = counts.filter { pattern == nil || Channel.matches(pattern: pattern!, name: $0.channel) }
                .sorted { ($0.subscribers, $1.channel) > ($1.subscribers, $0.channel) }
            let list = selected.map {
                JSONValue.object(["channel": .string($0.channel), "subscribers": JSONValue($0.subscribers)])
            }
            return Self.json(.ok, .object(["channels": .array(list)]))
        }
    }

    private func presence(_ query: Query, queries: any EngineQueries, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<Response>
    {
        guard let channel = query["channel"], Channel.isValidNameOrPattern(channel) else {
            return loop.makeSucceededFuture(Self.error(.badRequest, "channel must be a channel name or pattern"))
        }
        return queries.presence(of: channel, now: now, on: loop).map { entries in
            let clients = entries.sorted { ($0.sinceMilliseconds, $0.clientId) < ($1.sinceMilliseconds, $1.clientId) }
                .map { entry in
                    JSONValue.object([
                        "clientId": .string(entry.clientId),
                        "user": entry.user.map(JSONValue.string) ?? .null,
                        "transport": entry.transport.map(JSONValue.string) ?? .null,
                        "since": .string(WallClock.iso8601(milliseconds: entry.sinceMilliseconds)),
                    ])
                }
            return Self.json(.ok, .object(["channel": .string(channel), "clients": .array(clients)]))
        }
    }

    private func history(_ query: Query, queries: any EngineQueries, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<Response>
    {
        guard let channel = query["channel"], Channel.isValidNameOrPattern(channel) else {
            return loop.makeSucceededFuture(Self.error(.badRequest, "channel must be a channel name or pattern"))
        }
        var limit = 100
        if let text = query["limit"] {
            guard let value = Int(text), value > 0, value <= 1000 else {
                return loop.makeSucceededFuture(Self.error(.badRequest, "limit must be between 1 and 1000"))
            }
            limit = value
        }
        let since = query["since"]
        let depth = maxJSONDepth + 2
        return queries.history(of: channel, since: since, limit: limit, now: now, on: loop).map { page in
            var messages: [JSONValue] = []
            for (name, event) in page.events {
                // The bytes subscribers got, `[{…}]`: data and position are read from them as sent.
                guard let fields = (try? JSONParser(maxDepth: depth).parse(event))?.arrayValue?.first?.objectValue
                else { continue }
                var entry: JSONObject = ["channel": .string(name), "data": fields["data"] ?? .null]
                entry["position"] = fields["ext"]?.objectValue?["position"] ?? .null
                messages.append(.object(entry))
            }
            var answer: JSONObject = [
                "channel": .string(channel), "messages": .array(messages), "recovered": .bool(page.recovered),
            ]
            if page.truncated { answer["more"] = .bool(true) }
            return Self.json(.ok, .object(answer))
        }
    }

    /// This node's report, before the engine adds its sessions.
    private func localReport() -> NodeReport {
        var local = NodeReport(
            id: nodeID, uptimeSeconds: (NIODeadline.now() - startedAt).nanoseconds / 1_000_000_000, clients: 0,
            clientsByTransport: [:], subscriptions: 0)
        (local.publishRate, local.deliveryRate, local.dropRate) = rates.current()
        return local
    }

    /// Stores this node's report where the other nodes of a cluster read it (nothing for the memory engine, or
    /// an engine that answers no questions).
    func refreshNodeReport(on loop: any EventLoop) {
        queries?.nodes(local: localReport(), on: loop).whenFailure { _ in }
    }

    private func info(queries: any EngineQueries, on loop: any EventLoop) -> EventLoopFuture<Response> {
        return queries.nodes(local: localReport(), on: loop).map { reports in
            let total = reports.reduce(0) { $0 + $1.clients }
            let nodes = reports.sorted { $0.id < $1.id }.map(\.json)
            return Self.json(.ok, .object(["nodes": .array(nodes), "clients": JSONValue(total)]))
        }
    }

    // MARK: Helpers

    private func parseObject(_ body: ByteBuffer?) -> Result<JSONObject, ResponseError> {
        guard let body, body.readableBytes > 0 else {
            return .failure(.init(Self.error(.badRequest, "a JSON body is required")))
        }
        do {
            guard let object = try JSONParser(maxDepth: maxJSONDepth).parse(body).objectValue else {
                return .failure(.init(Self.error(.badRequest, "the body must be a JSON object")))
            }
            return .success(object)
        } catch {
            return .failure(.init(Self.error(.badRequest, "invalid JSON: \(error)")))
        }
    }

    struct ResponseError: Error {
        var response: Response
        init(_ response: Response) { self.response = response }
    }

    static func json(_ status: HTTPResponseStatus, _ value: JSONValue) -> Response {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/json; charset=utf-8")
        headers.add(name: "Cache-Control", value: "no-store")
        var body = ByteBuffer()
        body.writeJSON(value)
        body.writeString("\n")
        return Response(status: status, headers: headers, body: body)
    }

    static func error(_ status: HTTPResponseStatus, _ message: String) -> Response {
        json(status, .object(["error": .string(message)]))
    }

    static let notFound = error(.notFound, "not found")

    /// `channels`, `presence`, `history` and `info` of an engine that does not answer the server API's questions
    /// (one that implements `Engine` alone).
    static let notAnswered = error(
        .notImplemented, "this engine does not answer the server API's questions (channels, presence, history, info)")

    static func methodNotAllowed(_ allow: String) -> Response {
        var response = error(.methodNotAllowed, "method not allowed")
        response.headers.add(name: "Allow", value: allow)
        return response
    }
}

extension Result where Failure == ServerAPI.ResponseError {
    fileprivate static func failure(_ response: ServerAPI.Response) -> Self { .failure(.init(response)) }
}

/// A request's query string, decoded (`+` and `%XX`); the first of a repeated name wins.
struct Query {
    private let raw: Substring.UTF8View?

    init(uri: String) {
        raw = uri.firstIndex(of: "?").map { uri[uri.index(after: $0)...].utf8 }
    }

    subscript(name: String) -> String? {
        guard let raw, let bytes = FormData.value(of: name, in: raw) else { return nil }
        return String(validating: bytes, as: UTF8.self)
    }
}

/// Publishes, deliveries and drops per second, sampled once a second from the engine's counters, for the last
/// five minutes (the dashboard plots them; `/api/info` reports the latest).
final class APIRates: Sendable {
    struct Sample: Sendable {
        var at: Int64
        var published: UInt64
        var queued: UInt64
        var drops: UInt64
    }

    static let kept = 300
    private let samples = NIOLockedValueBox(CircularBuffer<Sample>(initialCapacity: 301))

    func record(_ statistics: EngineStatistics) {
        let sample = Sample(
            at: WallClock.nowMilliseconds(), published: statistics.published, queued: statistics.queued,
            drops: statistics.overflowDrops)
        samples.withLockedValue {
            $0.append(sample)
            if $0.count > Self.kept { $0.removeFirst() }
        }
    }

    /// Rates over the last interval between samples.
    func current() -> (Double, Double, Double) {
        samples.withLockedValue { s in
            guard s.count >= 2 else { return (0, 0, 0) }
            return Self.rates(s[s.index(before: s.index(before: s.endIndex))], s[s.index(before: s.endIndex)])
        }
    }

    static func rates(_ a: Sample, _ b: Sample) -> (Double, Double, Double) {
        let seconds = max(0.001, Double(b.at - a.at) / 1000)
        return (
            Double(b.published &- a.published) / seconds, Double(b.queued &- a.queued) / seconds,
            Double(b.drops &- a.drops) / seconds
        )
    }

    /// `{"series": [{"at": ms, "publishes": r, "deliveries": r, "drops": r}, …]}`, oldest first.
    func seriesJSON() -> JSONValue {
        let all = samples.withLockedValue { Array($0) }
        var points: [JSONValue] = []
        for (a, b) in zip(all, all.dropFirst()) {
            let (p, d, x) = Self.rates(a, b)
            points.append(
                .object([
                    "at": .number(String(b.at)), "publishes": NodeReportNumber.of(p),
                    "deliveries": NodeReportNumber.of(d), "drops": NodeReportNumber.of(x),
                ]))
        }
        return .object(["series": .array(points)])
    }
}

/// The last request errors of this node (kind and time), newest first; recorded where they are counted.
final class RecentErrors: Sendable {
    static let kept = 50
    private let entries = NIOLockedValueBox(CircularBuffer<(at: Int64, kind: RequestErrorKind)>(initialCapacity: 51))

    func record(_ kind: RequestErrorKind) {
        let at = WallClock.nowMilliseconds()
        entries.withLockedValue {
            $0.append((at, kind))
            if $0.count > Self.kept { $0.removeFirst() }
        }
    }

    /// `{"errors": [{"at": "<ISO 8601>", "kind": "bad_request"}, …]}`, newest first.
    func json() -> JSONValue {
        let all = entries.withLockedValue { Array($0) }
        return .object([
            "errors": .array(
                all.reversed().map {
                    .object(["at": .string(WallClock.iso8601(milliseconds: $0.at)), "kind": .string($0.kind.rawValue)])
                })
        ])
    }
}

enum NodeReportNumber {
    static func of(_ value: Double) -> JSONValue { .number(String((value * 100).rounded() / 100)) }
}
