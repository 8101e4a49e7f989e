import Bayeux
import Hummingbird
import HummingbirdWebSocket
import Logging
import NIOConcurrencyHelpers
import NIOCore

#if canImport(Glibc)
    import Glibc
#endif

/// A Simperium streaming server for tests, written from the protocol description (RELAY.md §4, SYNCING.md): a
/// WebSocket at `/sock/1/<app>/websocket` speaking `[<channel>:]<command>:<body>` text messages.
///
/// * `0:init:{"api","clientid","token","app_id","name",…}` → `0:auth:<user>` for an accepted token,
///   `0:auth:expired` for an expired one, `0:auth:{"msg","code":401}` (then close) for any other.
/// * `0:i:<data>:<mark>::<limit>` → `0:i:{"current","index":[{"id","v"}],"mark"?}`, entities in id order.
/// * `0:cv:<cv>` → `0:c:[…]` with the changes after it (possibly `[]`), after which the connection receives live
///   `0:c:[change]` pushes; an unknown cv → `0:cv:?` (or `0:c:?` with `unknownVersionReply`).
/// * `0:e:<id>.<v>` → `0:e:<id>.<v>\n{"data":…}` (an older version too: the fake keeps every version, unless
///   `forgetVersionHistory()`) or `…\n?`.
/// * `h:<n>` → `h:<n+1>` (unless heartbeats are switched off).
///
/// Faults: `dropConnections()`, `answerHeartbeats = false`, `forgetChangeLog(bucket:)` (every cv issued so far
/// becomes unknown). Entities change through `put`/`delete`, in process or via `POST /_fake/<action>` with a JSON
/// body (`put {"bucket","id","data"}`, `delete {"bucket","id"}`, `bulk {"bucket","prefix","count"}`, `drop {}`,
/// `forget {"bucket"}`, `heartbeats {"answer"}`, `history {"keep": false}`).
public final class SimperiumFake: Sendable {
    public struct Options: Sendable {
        public var appID: String
        /// Accepted tokens and the user each one authenticates.
        public var tokens: [String: String]
        public var expiredTokens: Set<String>
        /// `cv:?` (the default) or `c:?`.
        public var unknownVersionReply: String
        /// Changes per `c` message of a catch-up.
        public var catchUpChunk: Int

        public init(
            appID: String = "test-app", tokens: [String: String] = ["secret-token": "user@example.com"],
            expiredTokens: Set<String> = [], unknownVersionReply: String = "cv:?", catchUpChunk: Int = 100
        ) {
            self.appID = appID
            self.tokens = tokens
            self.expiredTokens = expiredTokens
            self.unknownVersionReply = unknownVersionReply
            self.catchUpChunk = catchUpChunk
        }
    }

    enum Outgoing: Sendable {
        case text(String)
        case close
    }

    struct Entity {
        var version: Int64
        var data: JSONObject
        var deleted: Bool
        /// Every version's data: Simperium keeps an entity's history, so `e:<id>.<v>` answers an older version too.
        var history: [Int64: JSONObject] = [:]
    }

    struct Bucket {
        var entities: [String: Entity] = [:]
        /// Change objects in cv order.
        var log: [(cv: String, change: JSONObject)] = []
        /// Entries of `log` before this index are forgotten.
        var validFrom = 0
        /// The cv minted when the bucket was created or its log forgotten: the changes after it are `log[validFrom...]`.
        var base: String
        /// The latest cv (of the last change, or `base`).
        var head: String
    }

    struct Connection {
        var outgoing: AsyncStream<Outgoing>.Continuation
        var bucket: String?
        var live = false
    }

    /// Counters for tests.
    public struct Statistics: Sendable, Equatable {
        public var connections = 0
        public var heartbeatsReceived = 0
        public var heartbeatsAnswered = 0
        public var indexRequests = 0
        /// Every cv asked for with `cv:`, in order.
        public var versionRequests: [String] = []
        public var unknownVersionReplies = 0
    }

    struct State {
        var buckets: [String: Bucket] = [:]
        var connections: [Int: Connection] = [:]
        var nextConnection = 0
        var counter: UInt64 = 0
        var answerHeartbeats = true
        /// Off: only an entity's current version can be fetched (`e:` of an older one, or of a deleted entity, is `?`).
        var keepsHistory = true
        var statistics = Statistics()
    }

    public let options: Options
    private let state = NIOLockedValueBox(State())
    private let cvPrefix: String
    private let running = NIOLockedValueBox<Task<Void, any Error>?>(nil)

    public init(options: Options = Options()) {
        self.options = options
        self.cvPrefix = String(UInt32.random(in: 0x1000_0000...UInt32.max), radix: 16)
    }

    // MARK: - Scripting

    public var statistics: Statistics { state.withLockedValue { $0.statistics } }

    public var answerHeartbeats: Bool {
        get { state.withLockedValue { $0.answerHeartbeats } }
        set { state.withLockedValue { $0.answerHeartbeats = newValue } }
    }

    /// The bucket's latest cv.
    public func head(bucket: String) -> String {
        state.withLockedValue { state in Self.bucket(&state, bucket, mint: mint).head }
    }

    /// Creates or modifies an entity (a new version), pushes the change to live connections; returns the cv.
    @discardableResult
    public func put(bucket: String, id: String, data: JSONObject) -> String {
        state.withLockedValue { state -> String in
            var current = Self.bucket(&state, bucket, mint: mint)
            let old = current.entities[id]
            let sourceVersion = old.flatMap { $0.deleted ? nil : $0.version }
            let version = (old?.version ?? 0) + 1
            let cv = mint(&state)
            var change: JSONObject = [
                "clientid": "fake-writer", "cv": .string(cv), "ev": .number(String(version)), "id": .string(id),
                "o": "M", "v": .object(Self.diff(from: old.flatMap { $0.deleted ? nil : $0.data }, to: data)),
                "ccids": [.string("\(cv)-ccid")],
            ]
            if let sourceVersion { change["sv"] = .number(String(sourceVersion)) }
            var history = old?.history ?? [:]
            history[version] = data
            current.entities[id] = Entity(version: version, data: data, deleted: false, history: history)
            _ = Self.append(&state, bucket: bucket, current, cv: cv, change: change)
            return cv
        }
    }

    /// Removes an entity; false when it does not exist.
    @discardableResult
    public func delete(bucket: String, id: String) -> Bool {
        state.withLockedValue { state -> Bool in
            var current = Self.bucket(&state, bucket, mint: mint)
            guard let old = current.entities[id], !old.deleted else { return false }
            let cv = mint(&state)
            let change: JSONObject = [
                "clientid": "fake-writer", "cv": .string(cv), "ev": .number(String(old.version + 1)),
                "sv": .number(String(old.version)), "id": .string(id), "o": "-", "ccids": [.string("\(cv)-ccid")],
            ]
            current.entities[id] = Entity(version: old.version + 1, data: [:], deleted: true, history: old.history)
            _ = Self.append(&state, bucket: bucket, current, cv: cv, change: change)
            return true
        }
    }

    /// Every cv issued so far becomes unknown (`cv:?`), as after the server lost its change log.
    public func forgetChangeLog(bucket: String) {
        state.withLockedValue { state in
            var current = Self.bucket(&state, bucket, mint: mint)
            current.validFrom = current.log.count
            current.base = mint(&state)
            current.head = current.base
            state.buckets[bucket] = current
        }
    }

    /// From now on only an entity's current version can be fetched: `e:` of an older version (or of a deleted
    /// entity) is answered `?`, as for a version past the history the server keeps.
    public func forgetVersionHistory() {
        state.withLockedValue { $0.keepsHistory = false }
    }

    /// Closes every open connection.
    public func dropConnections() {
        let connections = state.withLockedValue { state -> [AsyncStream<Outgoing>.Continuation] in
            defer { state.connections.removeAll() }
            return state.connections.values.map(\.outgoing)
        }
        for connection in connections {
            connection.yield(.close)
            connection.finish()
        }
    }

    /// Sends `text` as it is to every open connection (to test how a client takes malformed input).
    public func sendRaw(_ text: String) {
        let connections = state.withLockedValue { $0.connections.values.map(\.outgoing) }
        for connection in connections { connection.yield(.text(text)) }
    }

    public var openConnections: Int { state.withLockedValue { $0.connections.count } }

    private func mint(_ state: inout State) -> String {
        state.counter += 1
        let number = String(state.counter, radix: 16)
        return cvPrefix + String(repeating: "0", count: max(0, 8 - number.count)) + number
    }

    private static func bucket(_ state: inout State, _ name: String, mint: (inout State) -> String) -> Bucket {
        if let bucket = state.buckets[name] { return bucket }
        let cv = mint(&state)
        let bucket = Bucket(base: cv, head: cv)
        state.buckets[name] = bucket
        return bucket
    }

    /// Stores the bucket with its new change and queues the change for live connections of the bucket.
    private static func append(
        _ state: inout State, bucket name: String, _ bucket: Bucket, cv: String,
        change: JSONObject
    ) -> [AsyncStream<Outgoing>.Continuation] {
        var bucket = bucket
        bucket.log.append((cv, change))
        bucket.head = cv
        state.buckets[name] = bucket
        let text = "0:c:" + JSONValue.array([.object(change)]).jsonString
        var pushed: [AsyncStream<Outgoing>.Continuation] = []
        for connection in state.connections.values where connection.live && connection.bucket == name {
            connection.outgoing.yield(.text(text))
            pushed.append(connection.outgoing)
        }
        return pushed
    }

    /// A jsondiff object replacing the changed keys (`+` to add, `r` to replace, `-` to remove).
    static func diff(from old: JSONObject?, to new: JSONObject) -> JSONObject {
        var diff = JSONObject()
        for (key, value) in new.entries {
            if let previous = old?[key] {
                if previous != value { diff[key] = .object(["o": "r", "v": value]) }
            } else {
                diff[key] = .object(["o": "+", "v": value])
            }
        }
        for key in old?.keys ?? [] where new[key] == nil { diff[key] = .object(["o": "-"]) }
        return diff
    }

    // MARK: - Protocol

    /// Handles one text message of connection `id`; the replies are queued on its outgoing stream (under the lock,
    /// so that a catch-up and the pushes after it keep their order).
    func receive(_ text: String, connection id: Int, app: String) {
        var rest = Substring(text)
        var channel = ""
        if let colon = rest.firstIndex(of: ":"), !rest[..<colon].isEmpty, rest[..<colon].allSatisfy(\.isNumber) {
            channel = String(rest[..<colon]) + ":"
            rest = rest[rest.index(after: colon)...]
        }
        guard let colon = rest.firstIndex(of: ":") else { return }
        let command = rest[..<colon]
        let body = rest[rest.index(after: colon)...]
        state.withLockedValue { state in
            guard let connection = state.connections[id] else { return }
            let out = connection.outgoing
            switch command {
            case "h":
                state.statistics.heartbeatsReceived += 1
                guard state.answerHeartbeats, let count = Int64(body) else { return }
                state.statistics.heartbeatsAnswered += 1
                out.yield(.text("h:\(count + 1)"))
            case "init":
                guard let object = try? JSONParser().parse(Array(body.utf8)).objectValue,
                    let token = object["token"]?.stringValue, let bucket = object["name"]?.stringValue,
                    !bucket.isEmpty, object["clientid"]?.stringValue != nil
                else {
                    out.yield(.text(channel + #"auth:{"msg":"invalid init message","code":400}"#))
                    out.yield(.close)
                    return
                }
                if options.expiredTokens.contains(token) {
                    out.yield(.text(channel + "auth:expired"))
                    out.yield(.close)
                    return
                }
                guard let user = options.tokens[token], object["app_id"]?.stringValue ?? app == app,
                    app == options.appID
                else {
                    out.yield(.text(channel + #"auth:{"msg":"Token invalid","code":401}"#))
                    out.yield(.close)
                    return
                }
                _ = Self.bucket(&state, bucket, mint: mint)
                state.connections[id]?.bucket = bucket
                out.yield(.text(channel + "auth:" + user))
            case "i":
                guard let name = connection.bucket, let bucket = state.buckets[name] else { return }
                state.statistics.indexRequests += 1
                // <data>:<mark>:<offset>:<limit>
                let fields = body.split(separator: ":", omittingEmptySubsequences: false)
                let mark = fields.count > 1 ? Self.unhex(fields[1]) : nil
                let limit = fields.last.flatMap { Int($0) }.map { min(max($0, 1), 1000) } ?? 100
                let ids = bucket.entities.filter { !$0.value.deleted }.keys.sorted()
                let start = mark.map { mark in ids.firstIndex { $0 >= mark } ?? ids.count } ?? 0
                let page = ids[start..<min(ids.count, start + limit)]
                var reply: JSONObject = [
                    "current": .string(bucket.head),
                    "index": .array(
                        page.map { id in
                            .object(["id": .string(id), "v": .number(String(bucket.entities[id]!.version))])
                        }),
                ]
                if start + limit < ids.count { reply["mark"] = .string(Self.hex(ids[start + limit])) }
                out.yield(.text(channel + "i:" + reply.jsonString))
            case "cv":
                guard let name = connection.bucket, let bucket = state.buckets[name] else { return }
                let cv = String(body)
                state.statistics.versionRequests.append(cv)
                let known = bucket.log[bucket.validFrom...]
                var changes: ArraySlice<(cv: String, change: JSONObject)>
                if cv == bucket.head {
                    changes = []
                } else if cv == bucket.base {
                    changes = known
                } else if let index = known.firstIndex(where: { $0.cv == cv }) {
                    changes = bucket.log[(index + 1)...]
                } else {
                    state.statistics.unknownVersionReplies += 1
                    out.yield(.text(channel + options.unknownVersionReply))
                    return
                }
                if changes.isEmpty { out.yield(.text(channel + "c:[]")) }
                while !changes.isEmpty {
                    let chunk = changes.prefix(options.catchUpChunk)
                    changes = changes.dropFirst(chunk.count)
                    out.yield(.text(channel + "c:" + JSONValue.array(chunk.map { .object($0.change) }).jsonString))
                }
                state.connections[id]?.live = true
            case "e":
                guard let name = connection.bucket, let bucket = state.buckets[name],
                    let dot = body.lastIndex(of: ".")
                else { return }
                let entityID = String(body[..<dot])
                let version = Int64(body[body.index(after: dot)...])
                let data = bucket.entities[entityID].flatMap { entity -> JSONObject? in
                    guard let version else { return nil }
                    if !entity.deleted && entity.version == version { return entity.data }
                    return state.keepsHistory ? entity.history[version] : nil
                }
                if let data {
                    out.yield(.text(channel + "e:\(body)\n" + (["data": .object(data)] as JSONObject).jsonString))
                } else {
                    out.yield(.text(channel + "e:\(body)\n?"))
                }
            default:
                return
            }
        }
    }

    static func hex(_ text: String) -> String {
        text.utf8.map { byte in
            let digits = String(byte, radix: 16)
            return byte < 16 ? "0" + digits : digits
        }.joined()
    }

    static func unhex(_ text: Substring) -> String? {
        guard !text.isEmpty, text.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(index, offsetBy: 2)
            guard let byte = UInt8(text[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    // MARK: - Server

    /// Handles one WebSocket connection until it or the fake closes it.
    func serve(inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter, app: String) async throws {
        let (stream, continuation) = AsyncStream<Outgoing>.makeStream()
        let id = state.withLockedValue { state -> Int in
            state.nextConnection += 1
            state.statistics.connections += 1
            state.connections[state.nextConnection] = Connection(outgoing: continuation)
            return state.nextConnection
        }
        defer {
            state.withLockedValue { _ = $0.connections.removeValue(forKey: id) }
            continuation.finish()
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for await item in stream {
                    switch item {
                    case .text(let text): try await outbound.write(.text(text))
                    case .close: return
                    }
                }
            }
            group.addTask {
                for try await message in inbound.messages(maxSize: 1 << 20) {
                    guard case .text(let text) = message else { return }
                    self.receive(text, connection: id, app: app)
                }
            }
            defer { group.cancelAll() }
            _ = try await group.next()
        }
    }

    /// Runs the server on 127.0.0.1:`port` (0: any free port) in a background task; returns the port.
    public func start(port: Int = 0, tls: FakeTLS? = nil, logger: Logger = Logger(label: "relay-fake.simperium"))
        async throws -> Int
    {
        let router = Router()
        router.post("/_fake/:action") { request, context -> String in
            var request = request
            let body = try await request.collectBody(upTo: 1 << 20)
            let object = (try? JSONParser().parse(body).objectValue) ?? [:]
            return try self.control(context.parameters.get("action") ?? "", object)
        }
        let ports = AsyncStream<Int>.makeStream()
        let app = Application(
            router: router,
            server: try FakeTLS.server(
                tls,
                .http1WebSocketUpgrade {
                    request, _, _ -> ShouldUpgradeResult<WebSocketDataHandler<HTTP1WebSocketUpgradeChannel.Context>> in
                    let parts = (request.path ?? "").split(separator: "?")[0].split(separator: "/")
                    guard parts.count == 4, parts[0] == "sock", parts[1] == "1", parts[3] == "websocket" else {
                        return .dontUpgrade
                    }
                    let app = String(parts[2])
                    return .upgrade([:]) { inbound, outbound, _ in
                        try await self.serve(inbound: inbound, outbound: outbound, app: app)
                    }
                }),
            configuration: .init(address: .hostname("127.0.0.1", port: port), serverName: "simperium-fake"),
            onServerRunning: { channel in
                ports.continuation.yield(channel.localAddress?.port ?? 0)
                ports.continuation.finish()
            },
            logger: logger)
        let task = Task { try await app.run() }
        running.withLockedValue { $0 = task }
        for await port in ports.stream { return port }
        _ = try await task.value
        throw HTTPError(.internalServerError, message: "the fake server did not start")
    }

    /// Closes every connection and stops the server.
    public func stop() async {
        dropConnections()
        let task = running.withLockedValue { task -> Task<Void, any Error>? in
            defer { task = nil }
            return task
        }
        task?.cancel()
        _ = try? await task?.value
    }

    func control(_ action: String, _ object: JSONObject) throws -> String {
        func string(_ key: String) throws -> String {
            guard let value = object[key]?.stringValue else {
                throw HTTPError(.badRequest, message: "\(action): \(key) (a string) is required")
            }
            return value
        }
        switch action {
        case "put":
            let cv = put(bucket: try string("bucket"), id: try string("id"), data: object["data"]?.objectValue ?? [:])
            return (["cv": .string(cv)] as JSONObject).jsonString
        case "delete":
            guard delete(bucket: try string("bucket"), id: try string("id")) else {
                throw HTTPError(.notFound, message: "no such entity")
            }
            return "{}"
        case "bulk":
            let bucket = try string("bucket")
            let prefix = object["prefix"]?.stringValue ?? "n"
            let count = object["count"]?.integerValue ?? 1
            for index in 0..<max(0, Int(count)) {
                put(bucket: bucket, id: "\(prefix)\(index)", data: ["index": .number(String(index))])
            }
            return (["cv": .string(head(bucket: bucket))] as JSONObject).jsonString
        case "drop":
            dropConnections()
            return "{}"
        case "forget":
            forgetChangeLog(bucket: try string("bucket"))
            return "{}"
        case "heartbeats":
            if case .bool(let answer)? = object["answer"] { answerHeartbeats = answer }
            return "{}"
        case "history":
            if object["keep"] == .bool(false) { forgetVersionHistory() }
            return "{}"
        case "stats":
            let statistics = statistics
            let object: JSONObject = [
                "connections": .number(String(statistics.connections)),
                "open": .number(String(openConnections)),
                "heartbeats_received": .number(String(statistics.heartbeatsReceived)),
                "index_requests": .number(String(statistics.indexRequests)),
                "unknown_version_replies": .number(String(statistics.unknownVersionReplies)),
            ]
            return object.jsonString
        default:
            throw HTTPError(.notFound, message: "unknown action \(action)")
        }
    }
}

extension SimperiumFake: StandaloneFake {
    public static let name = "simperium"

    /// `relay-fake simperium [--port N] [--app ID] [--token TOKEN[=USER]]… [--expired-token TOKEN]… [--tls-cert PEM
    /// --tls-key PEM]`
    public static func runStandalone(arguments: [String]) async throws {
        var arguments = arguments
        let tls = try FakeTLS.extract(from: &arguments)
        var options = Options(tokens: [:])
        var port = 0
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            guard let value = iterator.next() else {
                throw HTTPError(.badRequest, message: "\(argument) needs a value")
            }
            switch argument {
            case "--port":
                guard let number = Int(value) else { throw HTTPError(.badRequest, message: "bad --port \(value)") }
                port = number
            case "--app": options.appID = value
            case "--token":
                let parts = value.split(separator: "=", maxSplits: 1)
                options.tokens[String(parts[0])] = parts.count > 1 ? String(parts[1]) : "user@example.com"
            case "--expired-token": options.expiredTokens.insert(value)
            default: throw HTTPError(.badRequest, message: "unknown option \(argument)")
            }
        }
        if options.tokens.isEmpty { options.tokens = ["secret-token": "user@example.com"] }
        let fake = SimperiumFake(options: options)
        var logger = Logger(label: "relay-fake.simperium")
        logger.logLevel = .warning
        let bound = try await fake.start(port: port, tls: tls, logger: logger)
        let line = Array("listening \(bound)\n".utf8)
        _ = line.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
        let task = fake.running.withLockedValue { $0 }
        _ = try await task?.value
    }
}
