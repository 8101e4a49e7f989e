import Bayeux
import NIOCore
import NIOHTTP1
import NIOPosix
import PubSubCore
import Testing

@testable import PubSubServer

/// An engine of the data path alone (`Engine`, neither `EngineQueries` nor `EngineObservability`): a memory
/// engine behind a wrapper that forwards only the data path.
class DataPathOnlyEngine: Engine, @unchecked Sendable {
    let inner = MemoryEngine(configuration: BrokerConfiguration())

    func createClient(now: NIODeadline, user: String?, on loop: any EventLoop) -> EventLoopFuture<String> {
        inner.createClient(now: now, user: user, on: loop)
    }
    func clientExists(_ clientId: String, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        inner.clientExists(clientId, on: loop)
    }
    func connect(
        _ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt, on loop: any EventLoop
    ) -> EventLoopFuture<ConnectResult> {
        inner.connect(clientId, now: now, sink: sink, receipt: receipt, on: loop)
    }
    func closeBatch(_ clientId: String, connectId: JSONValue?) -> UInt64? {
        inner.closeBatch(clientId, connectId: connectId)
    }
    func attach(_ clientId: String, sink: any DeliverySink, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        inner.attach(clientId, sink: sink, on: loop)
    }
    func detach(_ clientId: String, sink: any DeliverySink, takeEvents: Bool) -> CircularBuffer<WireEvent> {
        inner.detach(clientId, sink: sink, takeEvents: takeEvents)
    }
    func subscribe(_ clientId: String, to channels: [String], resume: String?, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<(SubscriptionResult, ResumeResult?)>
    {
        inner.subscribe(clientId, to: channels, resume: resume, now: now, on: loop)
    }
    func unsubscribe(_ clientId: String, from channels: [String], on loop: any EventLoop)
        -> EventLoopFuture<SubscriptionResult>
    {
        inner.unsubscribe(clientId, from: channels, on: loop)
    }
    func destroyClient(_ clientId: String, reason: DetachReason, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        inner.destroyClient(clientId, reason: reason, on: loop)
    }
    func publish(_ event: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<String?>
    {
        inner.publish(event, to: channel, now: now, on: loop)
    }
    func setUser(_ clientId: String, user: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        inner.setUser(clientId, user: user, on: loop)
    }
    func user(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        inner.user(of: clientId, on: loop)
    }
    func setGrant(_ clientId: String, grant: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        inner.setGrant(clientId, grant: grant, on: loop)
    }
    func grant(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        inner.grant(of: clientId, on: loop)
    }
    var position: String? { inner.position }
    func sweep(now: NIODeadline) { inner.sweep(now: now) }
    func shutdown() { inner.shutdown() }
    var statistics: EngineStatistics { inner.statistics }
}

/// The server API over an engine that answers no questions: the questions are answered 501, the rest works.
@Suite struct ServerAPIEngineTests {
    static let key = "0123456789abcdef"

    func api(_ engine: any Engine) -> ServerAPI {
        ServerAPI(
            key: Self.key, broker: Broker(engine: engine), rates: APIRates(), nodeID: "n1", startedAt: .now(),
            maxJSONDepth: 64, errors: RecentErrors())
    }

    func call(_ api: ServerAPI, _ method: HTTPMethod, _ uri: String, body: String? = nil, on loop: any EventLoop)
        async throws -> (HTTPResponseStatus, JSONObject)
    {
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: uri)
        head.headers.add(name: "Authorization", value: "apikey \(Self.key)")
        let call = String(uri.dropFirst("/api/".count).prefix { $0 != "?" })
        let response = try await api.respond(
            call: call, head: head, body: body.map { ByteBuffer(string: $0) }, address: "127.0.0.1", on: loop
        ).get()
        let object = try JSONParser().parse(response.body).objectValue ?? [:]
        return (response.status, object)
    }

    @Test func questionsAreNotImplementedWithoutEngineQueries() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let api = api(DataPathOnlyEngine())
        for uri in ["/api/channels", "/api/presence?channel=/a", "/api/history?channel=/a", "/api/info"] {
            let (status, object) = try await call(api, .GET, uri, on: loop)
            #expect(status == .notImplemented, "\(uri)")
            #expect(object["error"]?.stringValue?.contains("does not answer") == true, "\(uri)")
        }
        // Wrong methods are still 405, and the data path's calls still work.
        #expect(try await call(api, .POST, "/api/channels", on: loop).0 == .methodNotAllowed)
        let (status, object) = try await call(api, .POST, "/api/publish", body: #"{"channel":"/a","data":1}"#, on: loop)
        #expect(status == .ok)
        #expect(object["position"] != nil)
        api.refreshNodeReport(on: loop)
    }

    @Test func questionsAreAnsweredByTheMemoryEngine() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let api = api(MemoryEngine(configuration: BrokerConfiguration()))
        for uri in ["/api/channels", "/api/presence?channel=/a", "/api/history?channel=/a", "/api/info"] {
            #expect(try await call(api, .GET, uri, on: loop).0 == .ok, "\(uri)")
        }
    }

    @Test func connectsWorkOverAnEngineWithoutQueries() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        // The broker notes a connect's type for presence only when the engine answers queries.
        let broker = Broker(engine: DataPathOnlyEngine())
        func send(_ json: String) async throws -> [Outcome] {
            try await broker.handle(
                MessageBatch.elements(of: try JSONParser().parse(json))!,
                context: RequestContext(connectionType: .websocket), sink: nil, now: .now(), on: loop
            ).get()
        }
        let handshake = try await send(
            #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["websocket"]}"#)
        guard case .reply(let reply) = handshake[0], let clientId = reply.clientId else {
            Issue.record("no handshake reply")
            return
        }
        let connect = try await send(
            #"{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"websocket"}"#)
        guard case .connect = connect[0] else {
            Issue.record("the connect failed")
            return
        }
    }
}
