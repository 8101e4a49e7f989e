import Bayeux
import Hummingbird
import Logging
import NIOCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A fake CouchDB-style `_changes` server on 127.0.0.1, built from the protocol description (RELAY.md §1) with the
/// bytes CouchDB 3 writes (`chttpd_db.erl`):
///
/// * `GET /{db}/_changes?feed=normal|longpoll|continuous|live|eventsource&since=&heartbeat=&timeout=&include_docs=
///   &filter=&channels=&doc_ids=&limit=` (header `Last-Event-ID` overrides `since` for eventsource);
///   `filter` is `_doc_ids`, `_design`, `sync_gateway/bychannel` (with `channels=a,b`, Sync Gateway flavour) or the
///   design filter `app/important` (documents with `"important": true`); an unknown `since` is answered
///   `400 {"error":"bad_request","reason":"Malformed sequence supplied in 'since' parameter."}`.
/// * `PUT /{db}/{id}` (JSON body, `_rev` or `?rev=` to update; `"_deleted": true` writes a tombstone that keeps the
///   body's other fields) → `201 {"ok":true,"id","rev"}` or 409;
///   `DELETE /{db}/{id}?rev=` → `200 {"ok":true,"id","rev"}`; `GET /{db}` → `{"db_name","update_seq"}`.
/// * Faults: `POST /_fake/faults` with `{"drop_after_rows":N,"drop_mid_line":true,"replay_rows":N,
///   "garbage_after_rows":N}` (the next feed served, not one refused with 400), `POST /_fake/mute` (open feeds fall silent), `POST /_fake/forget` (every `since` handed out becomes
///   unknown), `GET /_fake/requests` (the `since` of every feed request). `limit` holds for every feed type:
///   `normal` answers at most `limit` rows, `last_seq` being the seq of the last one, as CouchDB does.
///
/// Deviations kept on purpose: Sync Gateway's minimum heartbeat (25 s) is not enforced, so tests can run fast.
public final class CouchDBFake: Sendable {
    public let store: CouchDBFakeStore
    public let port: Int
    private let task: Task<Void, any Error>

    private init(store: CouchDBFakeStore, port: Int, task: Task<Void, any Error>) {
        self.store = store
        self.port = port
        self.task = task
    }

    /// Starts a server on 127.0.0.1:`port` (0: a free one) and returns once it listens.
    public static func start(store: CouchDBFakeStore, port: Int = 0) async throws -> CouchDBFake {
        let (ports, continuation) = AsyncStream<Int>.makeStream()
        let application = try makeApplication(store: store, port: port) { bound in continuation.yield(bound) }
        let task = Task { try await application.run() }
        for await bound in ports { return CouchDBFake(store: store, port: bound, task: task) }
        task.cancel()
        throw CancellationError()
    }

    /// `http://127.0.0.1:<port>/<db>`.
    public var url: String { "http://127.0.0.1:\(port)/\(store.database)" }

    public func stop() async {
        store.stop()
        task.cancel()
        _ = await task.result
    }

    static func makeApplication(
        store: CouchDBFakeStore, port: Int, tls: FakeTLS? = nil,
        onListening: @escaping @Sendable (Int) -> Void
    ) throws -> some ApplicationProtocol {
        let router = Router()
        let handler = CouchDBFakeHandler(store: store)
        router.get("/_fake/requests") { _, _ in
            handler.json(.ok, ["requests": .array(store.feedRequests.map(JSONValue.string))])
        }
        router.post("/_fake/faults") { request, _ in try await handler.setFaults(request) }
        router.post("/_fake/mute") { _, _ in
            store.muteOpenFeeds()
            return handler.json(.ok, ["ok": true])
        }
        router.post("/_fake/forget") { _, _ in
            store.forgetHistory()
            return handler.json(.ok, ["ok": true])
        }
        router.get("/:db/_changes") { request, context in handler.changes(request, context) }
        router.get("/:db") { request, context in handler.info(request, context) }
        router.put("/:db/:id") { request, context in try await handler.put(request, context) }
        router.delete("/:db/:id") { request, context in handler.delete(request, context) }
        var logger = Logger(label: "relay-fake.couchdb")
        logger.logLevel = .critical
        return Application(
            router: router, server: try FakeTLS.server(tls, .http1()),
            configuration: .init(address: .hostname("127.0.0.1", port: port)),
            onServerRunning: { channel in onListening(channel.localAddress?.port ?? 0) }, logger: logger)
    }
}

extension CouchDBFake: StandaloneFake {
    public static var name: String { "couchdb" }

    /// `relay-fake couchdb [--port N] [--flavour integer|opaque|sync-gateway] [--db NAME] [--user USER:PASSWORD]
    /// [--tls-cert PEM --tls-key PEM]`.
    public static func runStandalone(arguments: [String]) async throws {
        var arguments = arguments
        let tls = try FakeTLS.extract(from: &arguments)
        var port = 0
        var flavour = CouchDBFakeStore.Flavour.opaque
        var database = "db"
        var credentials: String?
        var rest = arguments[...]
        while let option = rest.popFirst() {
            guard let value = rest.popFirst() else { throw FakeUsageError("\(option) needs a value") }
            switch option {
            case "--port":
                guard let number = Int(value), (0...65535).contains(number) else {
                    throw FakeUsageError("--port: expected 0…65535")
                }
                port = number
            case "--flavour":
                guard let parsed = CouchDBFakeStore.Flavour(rawValue: value) else {
                    throw FakeUsageError("--flavour: integer, opaque or sync-gateway")
                }
                flavour = parsed
            case "--db":
                database = value
            case "--user":
                guard value.contains(":") else { throw FakeUsageError("--user: expected user:password") }
                credentials = value
            default:
                throw FakeUsageError("unknown option \(option)")
            }
        }
        let store = CouchDBFakeStore(flavour: flavour, database: database, credentials: credentials)
        let application = try makeApplication(store: store, port: port, tls: tls) { bound in
            let line = Array("listening \(bound)\n".utf8)
            _ = line.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
        }
        try await application.runService()
    }
}

public struct FakeUsageError: Error, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

struct FeedDropped: Error {}

/// The request handlers of the fake.
struct CouchDBFakeHandler: Sendable {
    let store: CouchDBFakeStore

    func json(_ status: HTTPResponse.Status, _ object: JSONObject) -> Response {
        Response(
            status: status, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(string: object.jsonString + "\n")))
    }

    func error(_ status: HTTPResponse.Status, _ error: String, _ reason: String) -> Response {
        json(status, ["error": .string(error), "reason": .string(reason)])
    }

    /// 401 unless the request carries the store's credentials (when it has some), else 404 for another database.
    func checkDatabase(_ request: Request, _ context: BasicRequestContext) -> Response? {
        if let credentials = store.credentials,
            request.headers[.authorization] != "Basic " + base64(Array(credentials.utf8))
        {
            return error(.unauthorized, "unauthorized", "Name or password is incorrect.")
        }
        guard let db = context.parameters.get("db"), PercentDecoding.decodeLeniently(db) == store.database else {
            return error(.notFound, "not_found", "Database does not exist.")
        }
        return nil
    }

    func info(_ request: Request, _ context: BasicRequestContext) -> Response {
        if let missing = checkDatabase(request, context) { return missing }
        return json(.ok, ["db_name": .string(store.database), "update_seq": JSONValue(store.updateSeq)])
    }

    func put(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        if let missing = checkDatabase(request, context) { return missing }
        let id = PercentDecoding.decodeLeniently(context.parameters.get("id") ?? "")
        let bytes = try await request.body.collect(upTo: 1 << 20)
        guard let value = try? JSONParser().parse(bytes), var body = value.objectValue else {
            return error(.badRequest, "bad_request", "Request body must be a JSON object")
        }
        let rev = body["_rev"]?.stringValue ?? request.uri.queryParameters.get("rev")
        let deleted = body["_deleted"] == .bool(true)
        var clean = JSONObject()
        for (key, value) in body.entries where !key.hasPrefix("_") { clean[key] = value }
        body = clean
        do {
            // `{"_deleted": true, …}` deletes and keeps the other fields in the tombstone, as CouchDB does.
            guard !deleted || rev != nil else { throw CouchDBFakeStore.Conflict() }
            let newRev = deleted ? try store.delete(id, rev: rev, body: body) : try store.put(id, body, rev: rev)
            return json(.created, ["ok": true, "id": .string(id), "rev": .string(newRev)])
        } catch {
            return self.error(.conflict, "conflict", "Document update conflict.")
        }
    }

    func delete(_ request: Request, _ context: BasicRequestContext) -> Response {
        if let missing = checkDatabase(request, context) { return missing }
        let id = PercentDecoding.decodeLeniently(context.parameters.get("id") ?? "")
        guard let rev = request.uri.queryParameters.get("rev") else {
            return error(.conflict, "conflict", "Document update conflict.")
        }
        do {
            let newRev = try store.delete(id, rev: rev)
            return json(.ok, ["ok": true, "id": .string(id), "rev": .string(newRev)])
        } catch {
            return self.error(.conflict, "conflict", "Document update conflict.")
        }
    }

    func setFaults(_ request: Request) async throws -> Response {
        let bytes = try await request.body.collect(upTo: 1 << 16)
        guard let object = (try? JSONParser().parse(bytes))?.objectValue else {
            return error(.badRequest, "bad_request", "expected a JSON object")
        }
        var faults = CouchDBFakeStore.Faults()
        faults.dropAfterRows = object["drop_after_rows"]?.integerValue.map { Int($0) }
        faults.dropMidLine = object["drop_mid_line"] == .bool(true)
        faults.replayRows = object["replay_rows"]?.integerValue.map { Int($0) } ?? 0
        faults.garbageAfterRows = object["garbage_after_rows"]?.integerValue.map { Int($0) }
        store.setFaults(faults)
        return json(.ok, ["ok": true])
    }

    enum Feed: String {
        case normal, longpoll, continuous, eventsource
    }

    func changes(_ request: Request, _ context: BasicRequestContext) -> Response {
        if let missing = checkDatabase(request, context) { return missing }
        let parameters = request.uri.queryParameters
        let feedName = parameters.get("feed") ?? "normal"
        guard let feed = feedName == "live" ? .continuous : Feed(rawValue: feedName),
            !(feed == .eventsource && store.flavour == .syncGateway)
        else {
            return error(
                .badRequest, "bad_request", "Supported `feed` types: normal, continuous, live, longpoll, eventsource")
        }
        var query = CouchDBFakeStore.Query()
        query.includeDocs = parameters.get("include_docs") == "true"
        query.filter = parameters.get("filter")
        query.channels = (parameters.get("channels") ?? "").split(separator: ",").map(String.init)
        if let ids = parameters.get("doc_ids"), let array = (try? JSONParser().parse(ids))?.arrayValue {
            query.docIDs = array.compactMap(\.stringValue)
        }
        if let filter = query.filter,
            !["_doc_ids", "_design", "app/important"].contains(filter)
                && !(filter == "sync_gateway/bychannel" && store.flavour == .syncGateway)
        {
            return error(.notFound, "not_found", "missing json key: filters")
        }
        var heartbeat: Int?
        if let value = parameters.get("heartbeat") {
            if value == "true" {
                heartbeat = 60000
            } else if let ms = Int(value), ms > 0 {
                heartbeat = ms
            } else if value != "false" && value != "0" {
                return error(.badRequest, "bad_request", "Invalid heartbeat value. Expecting a positive integer value.")
            }
        }
        let timeout = min(parameters.get("timeout").flatMap { Int($0) } ?? 60000, 60000)
        let limit = parameters.get("limit").flatMap { Int($0) }.map { max($0, 1) }
        var sinceText = parameters.get("since")
        if feed == .eventsource, let lastEventID = request.headers[.init("Last-Event-ID")!] { sinceText = lastEventID }

        let store = store
        let opened = store.state.withLock {
            state -> (id: Int, since: CouchDBFakeStore.Since, faults: CouchDBFakeStore.Faults) in
            let id = state.feedRequests.count
            state.feedRequests.append(sinceText ?? "")
            state.feedQueries.append(request.uri.query ?? "")
            let since = store.parseSince(sinceText, state: state)
            // Faults are for the next feed that is served, not for one refused with a 400.
            guard since != .unknown else { return (id, since, .init()) }
            let faults = state.faults
            state.faults = .init()
            return (id, since, faults)
        }
        guard case .after(var cursor) = opened.since else {
            if store.flavour == .syncGateway {
                return error(.badRequest, "Bad Request", "Malformed sequence ID in 'since' parameter")
            }
            return error(.badRequest, "bad_request", "Malformed sequence supplied in 'since' parameter.")
        }
        if opened.faults.replayRows > 0 {
            let earlier = store.state.withLock { $0.entries.map(\.seq).filter { $0 <= cursor } }
            cursor =
                earlier.count > opened.faults.replayRows ? earlier[earlier.count - opened.faults.replayRows - 1] : 0
        }
        let contentType = feed == .eventsource ? "text/event-stream" : "application/json"
        let feedID = opened.id
        let faults = opened.faults
        let (start, fixedQuery, fixedHeartbeat) = (cursor, query, heartbeat)
        return Response(
            status: .ok, headers: [.contentType: contentType],
            body: ResponseBody { writer in
                var cursor = start
                let query = fixedQuery
                let heartbeat = fixedHeartbeat
                var written = 0
                var lastWrite = ContinuousClock.now
                let deadline = ContinuousClock.now + .milliseconds(timeout)
                var first = true
                let listFeed = feed == .normal || feed == .longpoll
                func send(_ text: String) async throws {
                    try await writer.write(ByteBuffer(string: text))
                    lastWrite = .now
                }
                if listFeed { try await send("{\"results\":[\n") }
                while true {
                    let (stopped, muted) = store.state.withLock { ($0.stopped, feedID < $0.mutedBelow) }
                    if stopped { throw FeedDropped() }
                    if muted {
                        try await Task.sleep(for: .milliseconds(20))
                        if ContinuousClock.now > lastWrite + .seconds(60) { throw FeedDropped() }
                        continue
                    }
                    let remaining = limit.map { $0 - written }
                    let scan = store.rows(after: cursor, query: query, limit: remaining)
                    for row in scan.rows {
                        let text: String
                        switch feed {
                        case .normal, .longpoll: text = (first ? "" : ",\r\n") + row.json
                        case .continuous: text = row.json + "\n"
                        case .eventsource: text = "data: \(row.json)\nid: \(row.seqJSON)\n\n"
                        }
                        if let garbage = faults.garbageAfterRows, written == garbage {
                            try await send(feed == .eventsource ? "data: {\"seq\":\n\n" : "{\"seq\":1,\"id\":\n")
                        }
                        if let drop = faults.dropAfterRows, written == drop {
                            if faults.dropMidLine { try await send(String(text.prefix(text.count / 2))) }
                            throw FeedDropped()
                        }
                        try await send(text)
                        first = false
                        written += 1
                        cursor = row.seq
                    }
                    cursor = max(cursor, scan.scannedTo)
                    let done =
                        feed == .normal || (feed == .longpoll && written > 0)
                        || (limit.map { written >= $0 } ?? false)
                    let timedOut = heartbeat == nil && ContinuousClock.now >= deadline
                    if done || timedOut {
                        let lastSeq = store.state.withLock { store.render(cursor, state: &$0) }
                        let pending = store.flavour == .opaque ? ",\"pending\":\(scan.pending)" : ""
                        switch feed {
                        case .normal, .longpoll: try await send("\n],\n\"last_seq\":\(lastSeq)\(pending)}\n")
                        case .continuous: try await send("{\"last_seq\":\(lastSeq)\(pending)}\n")
                        case .eventsource: break
                        }
                        try await writer.finish(nil)
                        return
                    }
                    if scan.rows.isEmpty, let heartbeat, ContinuousClock.now >= lastWrite + .milliseconds(heartbeat) {
                        try await send(feed == .eventsource ? "event: heartbeat\ndata: \n\n" : "\n")
                    }
                    if scan.rows.isEmpty { try await Task.sleep(for: .milliseconds(10)) }
                }
            })
    }
}

/// Standard base64 with padding.
func base64(_ bytes: [UInt8]) -> String {
    let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    var out: [UInt8] = []
    var index = 0
    while index < bytes.count {
        let chunk = Array(bytes[index..<min(index + 3, bytes.count)])
        let value = chunk.enumerated().reduce(0) { $0 | Int($1.element) << (16 - 8 * $1.offset) }
        for position in 0..<4 {
            out.append(position <= chunk.count ? alphabet[(value >> (18 - 6 * position)) & 0x3F] : UInt8(ascii: "="))
        }
        index += 3
    }
    return String(decoding: out, as: UTF8.self)
}
