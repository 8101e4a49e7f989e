import Bayeux
import HTTPTypes
import Hummingbird
import HummingbirdWebSocket
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOWebSocket

#if canImport(Glibc)
    import Glibc
#endif

/// A fake Couchbase Sync Gateway speaking BLIP v3 (`BLIP_3+CBMobile_3`) at `/<db>/_blipsync`, written from the
/// protocol description: it checks the client's checksums and reassembles its messages, answers `getCheckpoint`
/// (404 until set) and `setCheckpoint`, and on `subChanges` streams `changes` messages (`[[seq, id, rev,
/// deleted?], …]`) from `since` in batches, then `[]`, then live ones, keeping at most `maxUnanswered` unanswered.
/// A reply to `changes` that asks for revisions (an array of known revisions per entry) gets one `rev` message per
/// revision (properties `id`, `rev`, `sequence`, `deleted`; the revision's body), or `norev` for one whose body is
/// gone (`put(…, bodyLost: true)`). It can send frames compressed and split messages into several frames, and it
/// fails on a script: dropped connections, forgotten history (an ERR `HTTP`/400 "Invalid sequence" on an old
/// `since`).
public final class BLIPFake: Sendable {
    public struct Options: Sendable {
        public var database: String
        /// Largest payload of one frame the fake sends (small values split `changes` into many frames).
        public var framePayload: Int
        /// Compress every second message the fake sends.
        public var compress: Bool
        /// Most `changes` messages sent and not yet answered.
        public var maxUnanswered: Int

        public init(
            database: String = "db", framePayload: Int = 16384, compress: Bool = false,
            maxUnanswered: Int = 4
        ) {
            self.database = database
            self.framePayload = framePayload
            self.compress = compress
            self.maxUnanswered = maxUnanswered
        }
    }

    /// The latest revision of one document and the sequence it got.
    public struct Revision: Sendable, Equatable {
        public var seq: Int
        public var id: String
        public var rev: String
        public var deleted: Bool
        public var channels: [String]
        /// What the `rev` message carries (the document's properties, or a tombstone's); nil: a stand-in body
        /// (`{"_id", "_rev", "seq"}`, or `{"_deleted": true}` for a tombstone).
        public var body: JSONObject?
        /// Its body is gone by the time it is asked for (on Sync Gateway: superseded, and no longer kept): the
        /// reply to `changes` that asks for it gets `norev`.
        public var bodyLost: Bool
    }

    struct State {
        var sequence = 0
        var documents: [String: Revision] = [:]
        /// A `since` above zero and below this is refused (history was compacted away).
        var forgottenBelow = 0
        var checkpoints: [String: (rev: Int, body: [UInt8])] = [:]
        /// Connections close after sending this many more `changes` messages (a dropped connection).
        var dropAfterMessages: Int?
        var connections: [UInt64: FakeBLIPConnection] = [:]
        var nextConnection: UInt64 = 0
        // What happened, for assertions.
        var subscriptions: [String?] = []
        var acksReceived = 0
        var changesAnswered = 0
        var changesSent = 0
        var revsSent = 0
        var norevsSent = 0
        var protocolErrors: [String] = []
        var subprotocols: [String] = []
        var authorizations: [String?] = []
    }

    public let options: Options
    let state = NIOLockedValueBox(State())
    private let logger: Logger

    public init(options: Options = Options(), logger: Logger = Logger(label: "relay-fake.blip")) {
        self.options = options
        self.logger = logger
    }

    // MARK: - Script and inspection

    /// Writes a new revision of `id` (generation + 1), or a tombstone (which may keep fields, as a document
    /// deleted with a body does); returns its sequence. `body` is what its `rev` message carries; with `bodyLost`
    /// it is answered with `norev` instead, as Sync Gateway answers a revision it no longer has.
    @discardableResult
    public func put(
        _ id: String, deleted: Bool = false, channels: [String] = [], body: JSONObject? = nil,
        bodyLost: Bool = false
    ) -> Int {
        state.withLockedValue { state in
            state.sequence += 1
            let generation = (state.documents[id].flatMap { Int($0.rev.prefix { $0 != "-" }) } ?? 0) + 1
            state.documents[id] = Revision(
                seq: state.sequence, id: id, rev: "\(generation)-\(fakeDigest(id, generation))",
                deleted: deleted, channels: channels, body: body, bodyLost: bodyLost)
            return state.sequence
        }
    }

    /// Refuses every `since` between 0 and the current sequence from now on.
    public func forgetHistory() {
        state.withLockedValue { $0.forgottenBelow = $0.sequence + 1 }
    }

    /// Closes every connection now.
    public func dropConnections() {
        for connection in state.withLockedValue({ Array($0.connections.values) }) { connection.drop() }
    }

    /// Makes every open connection go silent without closing it: no more frames, no pong to the client's pings
    /// (a peer that died without a FIN). Such a connection is closed after `timeout`.
    public func stallConnections(closingAfter timeout: Duration = .seconds(10)) {
        for connection in state.withLockedValue({ Array($0.connections.values) }) {
            connection.stall(closingAfter: timeout)
        }
    }

    /// Sends every open connection a frame whose checksum is wrong (bad input: the client must close and reconnect).
    public func sendCorruptFrame() {
        for connection in state.withLockedValue({ Array($0.connections.values) }) {
            connection.sendRaw([0x7F, 0x00, 0x00, 0xDE, 0xAD, 0xBE, 0xEF])  // MSG #127, empty, bad CRC
        }
    }

    /// Sends every open connection a well-framed `changes` message whose body is not JSON.
    public func sendMalformedChanges() {
        for connection in state.withLockedValue({ Array($0.connections.values) }) {
            _ = try? connection.send(
                FakeBLIP.Message(
                    type: FakeBLIP.msg, number: 0, properties: ["Profile": "changes"],
                    body: Array("[[1,\"x\"".utf8)))
        }
    }

    /// Closes the connection once it sent `count` more `changes` messages and the client answered them.
    public func dropAfter(messages count: Int) {
        state.withLockedValue { $0.dropAfterMessages = count }
    }

    public var revisions: [Revision] { state.withLockedValue { $0.documents.values.sorted { $0.seq < $1.seq } } }
    /// The `since` of every `subChanges` received (nil when absent), in order.
    public var subscriptions: [String?] { state.withLockedValue { $0.subscriptions } }
    public var acksReceived: Int { state.withLockedValue { $0.acksReceived } }
    public var changesAnswered: Int { state.withLockedValue { $0.changesAnswered } }
    public var changesSent: Int { state.withLockedValue { $0.changesSent } }
    public var revsSent: Int { state.withLockedValue { $0.revsSent } }
    public var norevsSent: Int { state.withLockedValue { $0.norevsSent } }
    public var protocolErrors: [String] { state.withLockedValue { $0.protocolErrors } }
    public var subprotocols: [String] { state.withLockedValue { $0.subprotocols } }
    public var authorizations: [String?] { state.withLockedValue { $0.authorizations } }
    public var connectionCount: Int { state.withLockedValue { $0.connections.count } }

    // MARK: - Serving

    /// Listens on 127.0.0.1:`port` (0: any free port) until the task is cancelled; `onListening` gets the port.
    /// With `handleSignals`, SIGTERM and SIGINT stop it gracefully.
    public func run(
        port: Int = 0, handleSignals: Bool = false, tls: FakeTLS? = nil,
        onListening: @escaping @Sendable (Int) async -> Void
    ) async throws {
        let router = Router()
        let fake = self
        router.get("/\(options.database)/_blipsync") { _, _ -> Response in
            Response(
                status: .badRequest,
                body: .init(
                    byteBuffer: ByteBuffer(
                        string:
                            "{\"error\":\"Bad Request\",\"reason\":\"expected a WebSocket upgrade with subprotocol BLIP_3+CBMobile_3\"}"
                    )))
        }
        router.post("/_fake/docs") { request, _ -> String in
            var request = request
            let query = request.uri.queryParameters
            guard let id = query["id"] else { throw HTTPError(.badRequest, message: "id is required") }
            let channels = query["channels"].map { $0.split(separator: ",").map(String.init) } ?? []
            let bytes = try await request.collectBody(upTo: 1 << 20)
            var body: JSONObject?
            if bytes.readableBytes > 0 {
                guard let object = (try? JSONParser().parse(bytes))?.objectValue else {
                    throw HTTPError(.badRequest, message: "the body must be a JSON object")
                }
                body = object
            }
            let seq = fake.put(
                String(id), deleted: query["deleted"] == "1", channels: channels, body: body,
                bodyLost: query["norev"] == "1")
            return "{\"seq\":\(seq)}"
        }
        router.post("/_fake/bulk") { request, _ -> String in
            let query = request.uri.queryParameters
            let count = query["count"].flatMap { Int($0) } ?? 1
            let prefix = query["prefix"].map(String.init) ?? "doc"
            var seq = 0
            for index in 0..<count { seq = fake.put("\(prefix)\(index)") }
            return "{\"seq\":\(seq)}"
        }
        router.post("/_fake/drop") { _, _ -> String in
            fake.dropConnections()
            return "{}"
        }
        router.post("/_fake/forget") { _, _ -> String in
            fake.forgetHistory()
            return "{}"
        }
        router.get("/_fake/stats") { _, _ -> String in
            "{\"subscriptions\":\(fake.subscriptions.count),\"acks\":\(fake.acksReceived),\"answered\":\(fake.changesAnswered),\"errors\":\(fake.protocolErrors.count)}"
        }
        let path = "/\(options.database)/_blipsync"
        let app = Application(
            router: router,
            server: try FakeTLS.server(
                tls,
                .http1WebSocketUpgrade(configuration: .init(ws: .init(maxFrameSize: 1 << 22, autoPing: .disabled))) {
                    request, _, _ in
                    guard request.path?.split(separator: "?").first.map(String.init) == path else {
                        return .dontUpgrade
                    }
                    let offered = (request.headerFields[.secWebSocketProtocol] ?? "")
                        .split(separator: ",").map {
                            String($0.drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
                        }
                    guard let chosen = ["BLIP_3+CBMobile_3", "BLIP_3+CBMobile_2"].first(where: offered.contains) else {
                        return .dontUpgrade
                    }
                    fake.state.withLockedValue {
                        $0.subprotocols.append(chosen)
                        $0.authorizations.append(request.headerFields[.authorization])
                    }
                    return .upgrade([.secWebSocketProtocol: chosen]) { inbound, outbound, _ in
                        await fake.serve(inbound: inbound, outbound: outbound)
                    }
                }),
            configuration: .init(address: .hostname("127.0.0.1", port: port), serverName: "relay-fake-blip"),
            onServerRunning: { channel in await onListening(channel.localAddress?.port ?? 0) },
            logger: logger
        )
        if handleSignals { try await app.runService() } else { try await app.run() }
    }

    func serve(inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter) async {
        let (frames, continuation) = AsyncStream.makeStream(of: [UInt8].self)
        let id = state.withLockedValue { state -> UInt64 in
            state.nextConnection += 1
            return state.nextConnection
        }
        let connection = FakeBLIPConnection(fake: self, id: id, outgoing: continuation)
        state.withLockedValue { $0.connections[id] = connection }
        defer {
            state.withLockedValue { _ = $0.connections.removeValue(forKey: id) }
            connection.stop()
        }
        let reader = Task {
            let reader = FakeBLIPReader()
            do {
                for try await message in inbound.messages(maxSize: 1 << 22) {
                    guard case .binary(let buffer) = message else {
                        throw FakeBLIP.WireError(description: "text WebSocket message")
                    }
                    try connection.received(reader.read(Array(buffer.readableBytesView)))
                }
            } catch {
                if !connection.isStalled {
                    self.state.withLockedValue { $0.protocolErrors.append("\(error)") }
                    try? await outbound.close(.protocolError, reason: "\(error)".prefix(100).description)
                }
            }
            // A stalled connection stays open, silent: no reads (so no pongs) and no writes.
            if !connection.isStalled { connection.stop() }
        }
        connection.reader = reader
        for await frame in frames {
            if frame.isEmpty {  // the drop marker
                try? await outbound.close(.goingAway, reason: "dropped by script")
                break
            }
            do { try await outbound.write(.binary(ByteBuffer(bytes: frame))) } catch { break }
        }
        reader.cancel()
    }

    /// Entries after `since` (latest revision of each document, by sequence), filtered by channel.
    func changes(after since: Int, channels: Set<String>?, limit: Int) -> [Revision] {
        state.withLockedValue { state in
            Array(
                state.documents.values
                    .filter { revision in
                        revision.seq > since
                            && (channels.map { revision.channels.contains(where: $0.contains) } ?? true)
                    }
                    .sorted { $0.seq < $1.seq }
                    .prefix(limit))
        }
    }
}

/// One client connection of the fake: answers requests, streams changes for a subscription.
final class FakeBLIPConnection: Sendable {
    struct Sending {
        var writer: FakeBLIPWriter
        var nextNumber: UInt64 = 0
        var messagesSent = 0
        var unanswered: Set<UInt64> = []
        /// The entries of each `changes` message sent, for the `rev` messages its reply asks for.
        var sentEntries: [UInt64: [BLIPFake.Revision]] = [:]
        var stream: Task<Void, Never>?
        var reader: Task<Void, Never>?
        var stopped = false
        var stalled = false
    }

    let fake: BLIPFake
    let id: UInt64
    private let outgoing: AsyncStream<[UInt8]>.Continuation
    // The writer holds a deflate stream: only touched under this lock, in send order.
    private let sending: NIOLockedValueBox<UnsafeSending>

    // @unchecked: only ever inside `sending`, whose lock guards it.
    struct UnsafeSending: @unchecked Sendable { var value: Sending }

    init(fake: BLIPFake, id: UInt64, outgoing: AsyncStream<[UInt8]>.Continuation) {
        self.fake = fake
        self.id = id
        self.outgoing = outgoing
        self.sending = NIOLockedValueBox(
            UnsafeSending(value: Sending(writer: FakeBLIPWriter(frameSize: fake.options.framePayload))))
    }

    func drop() {
        outgoing.yield([])
        stop()
    }

    var isStalled: Bool { sending.withLockedValue { $0.value.stalled } }

    var reader: Task<Void, Never>? {
        get { sending.withLockedValue { $0.value.reader } }
        set { sending.withLockedValue { $0.value.reader = newValue } }
    }

    func sendRaw(_ frame: [UInt8]) {
        outgoing.yield(frame)
    }

    func stall(closingAfter timeout: Duration) {
        let tasks = sending.withLockedValue { box -> [Task<Void, Never>?] in
            box.value.stalled = true
            return [box.value.stream, box.value.reader]
        }
        for task in tasks { task?.cancel() }
        Task {
            try? await Task.sleep(for: timeout)
            self.stop()
        }
    }

    func stop() {
        let task = sending.withLockedValue { box -> Task<Void, Never>? in
            box.value.stopped = true
            return box.value.stream
        }
        task?.cancel()
        outgoing.finish()
    }

    /// Sends a message (a request gets the next number); every second one compressed when asked for.
    @discardableResult
    func send(_ message: FakeBLIP.Message) throws -> UInt64 {
        try sending.withLockedValue { box in
            guard !box.value.stalled else { return 0 }
            var message = message
            if message.type == FakeBLIP.msg {
                box.value.nextNumber += 1
                message.number = box.value.nextNumber
            }
            box.value.messagesSent += 1
            let compress = fake.options.compress && box.value.messagesSent % 2 == 0
            for frame in try box.value.writer.frames(message, compress: compress) { outgoing.yield(frame) }
            return message.number
        }
    }

    func received(_ item: FakeBLIPReader.Received?) throws {
        switch item {
        case .ack?:
            fake.state.withLockedValue { $0.acksReceived += 1 }
        case .message(let message)?:
            try handle(message)
        case .partial?, nil:
            break
        }
    }

    private func reply(
        to request: FakeBLIP.Message, properties: KeyValuePairs<String, String> = [:], body: [UInt8] = []
    ) throws {
        guard request.flags & FakeBLIP.noReply == 0 else { return }
        try send(FakeBLIP.Message(type: FakeBLIP.rpy, number: request.number, properties: properties, body: body))
    }

    private func error(to request: FakeBLIP.Message, domain: String, code: Int, _ text: String) throws {
        guard request.flags & FakeBLIP.noReply == 0 else { return }
        try send(
            FakeBLIP.Message(
                type: FakeBLIP.err, number: request.number,
                properties: ["Error-Domain": domain, "Error-Code": String(code)], body: Array(text.utf8)))
    }

    private func handle(_ message: FakeBLIP.Message) throws {
        if message.type == FakeBLIP.rpy {
            let entries = sending.withLockedValue { box -> [BLIPFake.Revision]? in
                guard box.value.unanswered.remove(message.number) != nil else { return nil }
                return box.value.sentEntries.removeValue(forKey: message.number)
            }
            guard let entries else { return }
            fake.state.withLockedValue { $0.changesAnswered += 1 }
            // An array aligned with the entries: null/0 = not wanted, an array of known revIDs = send the rev.
            let wanted = (try? JSONParser().parse(message.body))?.arrayValue ?? []
            for (index, entry) in entries.enumerated() where index < wanted.count && wanted[index].arrayValue != nil {
                if entry.bodyLost {
                    fake.state.withLockedValue { $0.norevsSent += 1 }
                    try send(
                        FakeBLIP.Message(
                            type: FakeBLIP.msg, number: 0, flags: FakeBLIP.noReply,
                            properties: [
                                "Profile": "norev", "id": entry.id, "rev": entry.rev, "sequence": String(entry.seq),
                                "error": "404", "reason": "missing",
                            ]))
                    continue
                }
                let body: JSONValue =
                    entry.body.map(JSONValue.object)
                    ?? (entry.deleted
                        ? .object(["_deleted": .bool(true)])
                        : .object([
                            "_id": .string(entry.id), "_rev": .string(entry.rev), "seq": .number(String(entry.seq)),
                        ]))
                // Counted before it is sent: a client may have it, and a test read the count, before `send` returns.
                fake.state.withLockedValue { $0.revsSent += 1 }
                try send(
                    FakeBLIP.Message(
                        type: FakeBLIP.msg, number: 0, flags: FakeBLIP.noReply,
                        properties: entry.deleted
                            ? [
                                "Profile": "rev", "id": entry.id, "rev": entry.rev, "sequence": String(entry.seq),
                                "deleted": "1",
                            ]
                            : ["Profile": "rev", "id": entry.id, "rev": entry.rev, "sequence": String(entry.seq)],
                        body: Array(body.jsonString.utf8)))
            }
            return
        }
        guard message.type == FakeBLIP.msg else { return }
        switch message.properties["Profile"] {
        case "getCheckpoint":
            let client = message.properties["client"] ?? ""
            if let checkpoint = fake.state.withLockedValue({ $0.checkpoints[client] }) {
                try reply(to: message, properties: ["rev": "0-\(checkpoint.rev)"], body: checkpoint.body)
            } else {
                try error(to: message, domain: "HTTP", code: 404, "missing")
            }
        case "setCheckpoint":
            let client = message.properties["client"] ?? ""
            let rev = fake.state.withLockedValue { state -> Int? in
                let current = state.checkpoints[client]
                if let current, message.properties["rev"] != "0-\(current.rev)" { return nil }
                let next = (current?.rev ?? 0) + 1
                state.checkpoints[client] = (next, message.body)
                return next
            }
            if let rev {
                try reply(to: message, properties: ["rev": "0-\(rev)"])
            } else {
                try error(to: message, domain: "HTTP", code: 409, "Document update conflict")
            }
        case "subChanges":
            try subscribe(message)
        default:
            try error(to: message, domain: "BLIP", code: 404, "no handler for profile")
        }
    }

    private func subscribe(_ request: FakeBLIP.Message) throws {
        let sinceText = request.properties["since"]
        fake.state.withLockedValue { $0.subscriptions.append(sinceText) }
        var since = 0
        if let sinceText {
            // The since is JSON: a number, or a string holding one.
            let parsed = try? JSONParser().parse(sinceText)
            guard let value = parsed?.integerValue ?? parsed?.stringValue.flatMap({ Int64($0) }), value >= 0 else {
                return try error(to: request, domain: "HTTP", code: 400, "Invalid sequence: \(sinceText)")
            }
            since = Int(value)
        }
        if since > 0 && since < fake.state.withLockedValue({ $0.forgottenBelow }) {
            return try error(to: request, domain: "HTTP", code: 400, "Invalid sequence")
        }
        try reply(to: request)
        let batch = max(1, Int(request.properties["batch"] ?? "") ?? 200)
        let continuous = request.properties["continuous"] == "true"
        var channels: Set<String>?
        if request.properties["filter"] == "sync_gateway/bychannel" {
            channels = Set((request.properties["channels"] ?? "").split(separator: ",").map(String.init))
        }
        let activeOnly = request.properties["activeOnly"] == "true"
        let task = Task { [self] in
            var last = since
            var caughtUp = false
            while !Task.isCancelled {
                let unanswered = sending.withLockedValue { $0.value.unanswered.count }
                // The scripted drop comes once the messages before it were answered, so the client's resume
                // position is known.
                if let remaining = fake.state.withLockedValue({ $0.dropAfterMessages }), remaining <= 0 {
                    if unanswered == 0 {
                        fake.state.withLockedValue { $0.dropAfterMessages = nil }
                        drop()
                        return
                    }
                    try? await Task.sleep(for: .milliseconds(5))
                    continue
                }
                if unanswered >= fake.options.maxUnanswered {
                    try? await Task.sleep(for: .milliseconds(5))
                    continue
                }
                let entries = fake.changes(after: last, channels: channels, limit: batch)
                if entries.isEmpty {
                    if !caughtUp {
                        caughtUp = true
                        _ = try? send(
                            FakeBLIP.Message(
                                type: FakeBLIP.msg, number: 0, properties: ["Profile": "changes"],
                                body: Array("[]".utf8)))
                        if !continuous { return }
                    }
                    try? await Task.sleep(for: .milliseconds(20))
                    continue
                }
                last = entries.last!.seq
                let rows = entries.filter { !(activeOnly && $0.deleted) }.map { entry -> JSONValue in
                    var row: [JSONValue] = [.number(String(entry.seq)), .string(entry.id), .string(entry.rev)]
                    if entry.deleted { row.append(.bool(true)) }
                    return .array(row)
                }
                if rows.isEmpty { continue }
                do {
                    let number = try send(
                        FakeBLIP.Message(
                            type: FakeBLIP.msg, number: 0, properties: ["Profile": "changes"],
                            body: Array(JSONValue.array(rows).jsonString.utf8)))
                    let sent = entries.filter { !(activeOnly && $0.deleted) }
                    sending.withLockedValue {
                        _ = $0.value.unanswered.insert(number)
                        $0.value.sentEntries[number] = sent
                    }
                    fake.state.withLockedValue { state in
                        state.changesSent += 1
                        state.dropAfterMessages = state.dropAfterMessages.map { $0 - 1 }
                    }
                } catch {
                    return
                }
            }
        }
        let old = sending.withLockedValue { box -> Task<Void, Never>? in
            defer { box.value.stream = task }
            return box.value.stream
        }
        old?.cancel()
    }
}

/// A short stable hex digest for fake revision IDs.
func fakeDigest(_ id: String, _ generation: Int) -> String {
    var hash: UInt64 = 0xCBF2_9CE4_8422_2325
    for byte in Array(id.utf8) + Array(String(generation).utf8) {
        hash = (hash ^ UInt64(byte)) &* 0x100_0000_01B3
    }
    return String(hash, radix: 16)
}

extension BLIPFake: StandaloneFake {
    public static let name = "blip"

    /// `relay-fake blip [--port N] [--db NAME] [--docs N] [--frame-size N] [--compress] [--tls-cert PEM --tls-key
    /// PEM]`: serves until SIGTERM; the control endpoints are `POST /_fake/docs?id=X[&deleted=1][&channels=a,b]
    /// [&norev=1]` (an optional JSON object body is the revision's body; `norev=1`: answered with `norev`),
    /// `POST /_fake/bulk?count=N[&prefix=P]`, `POST /_fake/drop`, `POST /_fake/forget` and `GET /_fake/stats`.
    public static func runStandalone(arguments: [String]) async throws {
        var arguments = arguments
        let tls = try FakeTLS.extract(from: &arguments)
        var options = Options()
        var port = 0
        var documents = 0
        var rest = arguments[...]
        func value(_ name: String) throws -> String {
            guard let value = rest.popFirst() else { throw FakeBLIP.WireError(description: "\(name) needs a value") }
            return value
        }
        while let argument = rest.popFirst() {
            switch argument {
            case "--port": port = Int(try value(argument)) ?? -1
            case "--db": options.database = try value(argument)
            case "--docs": documents = Int(try value(argument)) ?? 0
            case "--frame-size": options.framePayload = max(1, Int(try value(argument)) ?? 16384)
            case "--compress": options.compress = true
            default: throw FakeBLIP.WireError(description: "unknown option \(argument)")
            }
        }
        var logger = Logger(label: "relay-fake.blip")
        logger.logLevel = .warning
        let fake = BLIPFake(options: options, logger: logger)
        for index in 0..<documents { fake.put("doc\(index)") }
        let server = Task {
            try await fake.run(port: port, handleSignals: true, tls: tls) { port in
                let line = Array("listening \(port)\n".utf8)
                _ = line.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
            }
        }
        try await server.value
    }
}
