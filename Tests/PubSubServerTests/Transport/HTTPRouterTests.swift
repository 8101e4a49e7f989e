import Logging
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Prometheus
import Testing

@testable import PubSubCore
@testable import PubSubServer

/// The HTTP router and its responders without sockets: a route parsed once from the request line, the responder it
/// picks, and what `HTTPHandler` writes around a responder's answer (CORS, length, HEAD, keep-alive, 413).
@Suite struct HTTPRouterTests {
    static let key = "0123456789abcdef"

    static func makeShared(mount: String = "/faye", maxRequestBytes: Int = 1 << 20, apiKey: String? = key)
        -> ServerShared
    {
        let logger = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }
        let configuration = ServerConfiguration(mount: mount, maxRequestBytes: maxRequestBytes, apiKey: apiKey)
        let operations = ServerOperations(
            configuration: configuration.operations, loops: [], registry: PrometheusCollectorRegistry(), logger: logger)
        let broker = Broker(configuration: configuration.broker, logger: logger)
        return ServerShared(configuration: configuration, broker: broker, logger: logger, operations: operations)
    }

    static func request(
        _ method: HTTPMethod = .GET, _ uri: String, headers: HTTPHeaders = [:], mount: String = "/faye"
    ) -> RoutedRequest {
        let head = HTTPRequestHead(version: .http1_1, method: method, uri: uri, headers: headers)
        return RoutedRequest(head: head, body: nil, route: Route(path: uri, mount: mount), peerAddress: "192.0.2.1")
    }

    /// The response of a reply, waiting for it on the embedded loop when it comes later.
    static func response(_ reply: HTTPReply?, loop: EmbeddedEventLoop) throws -> HTTPResponse {
        switch try #require(reply) {
        case .now(let response): return response
        case .later(let future):
            loop.run()
            return try future.wait()
        }
    }

    // MARK: Routes

    @Test(arguments: [
        ("/healthz", Route.health), ("/healthz?probe=1", .health), ("/readyz", .ready), ("/metrics", .metrics),
        ("/api/info", .api("info")), ("/api/history?channel=/a", .api("history")), ("/admin", .admin),
        ("/admin/", .admin), ("/faye", .bayeux), ("/faye/", .bayeux), ("/faye?message=%5B%5D", .bayeux),
        ("/faye/abc123", .bayeuxWithSuffix("abc123")), ("/faye.js", .staticFile(".js")),
        ("/faye/client.js", .staticFile("client.js")), ("/faye/nope.js", .staticFile("nope.js")),
        ("/fayex", .notFound), ("/", .notFound),
    ])
    func routeOfAPath(path: String, route: Route) {
        #expect(Route(path: path, mount: "/faye") == route)
    }

    @Test func theRootMountServesBayeuxAtTheRoot() {
        #expect(Route(path: "/", mount: "") == .bayeux)
        #expect(Route(path: "/client.js", mount: "") == .staticFile("client.js"))
        #expect(Route(path: "/healthz", mount: "") == .health)
    }

    // MARK: The router

    @Test func theBayeuxMountIsLeftToTheHandler() {
        let router = HTTPRouter(shared: Self.makeShared())
        let loop = EmbeddedEventLoop()
        #expect(router.reply(to: Self.request(.POST, "/faye"), on: loop) == nil)
        #expect(router.reply(to: Self.request(.GET, "/faye/abc"), on: loop) == nil)
    }

    @Test func everyOtherRouteHasAResponder() throws {
        let router = HTTPRouter(shared: Self.makeShared())
        let loop = EmbeddedEventLoop()
        let answers = try [
            "/healthz", "/readyz", "/metrics", "/api/nosuch", "/admin", "/faye/client.js", "/faye/nope.js",
            "/elsewhere",
        ].map { try Self.response(router.reply(to: Self.request(.GET, $0), on: loop), loop: loop) }
        #expect(
            answers.map(\.status) == [
                .ok, .serviceUnavailable, .ok, .unauthorized, .unauthorized, .ok, .notFound, .notFound,
            ])
        // The API and the dashboard are same origin only; the rest may be read cross-origin as before.
        #expect(answers.map(\.crossOrigin) == [true, true, true, false, false, true, true, true])
    }

    // MARK: Responders with plain values

    @Test func healthAnswersOKInPlainText() throws {
        let loop = EmbeddedEventLoop()
        let response = try Self.response(
            HealthResponder().reply(to: Self.request(.GET, "/healthz"), on: loop), loop: loop)
        #expect(response.status == .ok)
        #expect(response.headers["content-type"] == ["text/plain; charset=utf-8"])
        #expect(String(buffer: response.body) == "ok\n")
    }

    @Test func notFoundNamesTheMount() throws {
        let loop = EmbeddedEventLoop()
        for (mount, named) in [("/faye", "/faye"), ("", "/")] {
            let responder = NotFoundResponder(mount: mount)
            let response = try Self.response(
                responder.reply(to: Self.request(.GET, "/x", mount: mount), on: loop), loop: loop)
            #expect(response.status == .notFound)
            #expect(String(buffer: response.body) == "Sure you're not looking for \(named) ?")
        }
    }

    @Test func staticFilesServeTheClientAndNothingElse() throws {
        let loop = EmbeddedEventLoop()
        let responder = StaticFileResponder()
        let get = try Self.response(responder.reply(to: Self.request(.GET, "/faye/client.js"), on: loop), loop: loop)
        #expect(get.status == .ok)
        #expect(get.headers["etag"] == [BrowserClient.etag])
        // A HEAD gets the GET's body: the handler sends its length and leaves it out.
        let head = try Self.response(responder.reply(to: Self.request(.HEAD, "/faye.js"), on: loop), loop: loop)
        #expect(head.status == .ok && head.body == get.body)
        let post = try Self.response(responder.reply(to: Self.request(.POST, "/faye/client.js"), on: loop), loop: loop)
        #expect(post.status == .methodNotAllowed && post.headers["allow"] == ["GET, HEAD"])
        let unknown = try Self.response(responder.reply(to: Self.request(.GET, "/faye/<b>.js"), on: loop), loop: loop)
        #expect(unknown.status == .notFound && String(buffer: unknown.body) == "Not found\n", "the name is not echoed")
        var revalidate = HTTPHeaders()
        revalidate.add(name: "If-None-Match", value: "W/\(BrowserClient.etag)")
        let cached = try Self.response(
            responder.reply(to: Self.request(.GET, "/faye/client.js", headers: revalidate), on: loop), loop: loop)
        #expect(cached.status == .notModified && cached.body.readableBytes == 0)
    }

    @Test func metricsAreNotFoundOnTheBrokerPortWhenAMetricsPortServesThem() throws {
        let logger = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }
        let configuration = ServerConfiguration(operations: OperationsConfiguration(metricsPort: 0))
        let operations = ServerOperations(
            configuration: configuration.operations, loops: [], registry: PrometheusCollectorRegistry(), logger: logger)
        let shared = ServerShared(
            configuration: configuration, broker: Broker(configuration: configuration.broker, logger: logger),
            logger: logger,
            operations: operations)
        try #require(operations.hasMetricsListener)
        let loop = EmbeddedEventLoop()
        let response = try Self.response(
            HTTPRouter(shared: shared).reply(to: Self.request(.GET, "/metrics"), on: loop), loop: loop)
        #expect(response.status == .notFound && String(buffer: response.body) == "Not found\n")
        // The metrics port answers it, with the same router, and no Bayeux mount or static files there.
        let onMetricsPort = HTTPRouter(shared: shared, onMetricsPort: true)
        let metrics = try Self.response(onMetricsPort.reply(to: Self.request(.GET, "/metrics"), on: loop), loop: loop)
        #expect(metrics.status == .ok)
        #expect(metrics.headers["content-type"] == ["text/plain; version=0.0.4; charset=utf-8"])
        for path in ["/faye", "/faye/client.js", "/elsewhere"] {
            let other = try Self.response(onMetricsPort.reply(to: Self.request(.GET, path), on: loop), loop: loop)
            #expect(other.status == .notFound && String(buffer: other.body) == "Not found\n", "\(path)")
        }
        let health = try Self.response(onMetricsPort.reply(to: Self.request(.GET, "/healthz"), on: loop), loop: loop)
        #expect(health.status == .ok && health.headers["cache-control"] == ["no-store"])
    }

    @Test func theAPIAndTheDashboardAnswerSameOriginOnly() throws {
        let shared = Self.makeShared()
        let loop = EmbeddedEventLoop()
        var headers = HTTPHeaders()
        headers.add(name: "Authorization", value: "apikey \(Self.key)")
        let api = APIResponder(api: shared.api, trustForwardedFor: false)
        let channels = try Self.response(
            api.reply(to: Self.request(.GET, "/api/channels", headers: headers), on: loop), loop: loop)
        #expect(channels.status == .ok && !channels.crossOrigin)
        #expect(String(buffer: channels.body) == "{\"channels\":[]}\n")
        let admin = try Self.response(
            AdminResponder(api: shared.api).reply(to: Self.request(.GET, "/admin", headers: headers), on: loop),
            loop: loop)
        #expect(admin.status == .ok && !admin.crossOrigin)
        #expect(admin.headers["content-type"] == ["text/html; charset=utf-8"])
    }

    // MARK: What the handler writes around a responder's answer

    struct Written {
        var head: HTTPResponseHead
        var body: String?
        var closed: Bool
    }

    /// Sends one request through an `HTTPHandler` on an embedded channel and reads what it wrote.
    static func exchange(
        _ method: HTTPMethod, _ uri: String, headers: [(String, String)] = [], body: String? = nil,
        version: HTTPVersion = .http1_1, shared: ServerShared = makeShared()
    ) throws -> Written {
        let channel = EmbeddedChannel()
        _ = channel.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 9))
        try channel.pipeline.syncOperations.addHandler(HTTPHandler(shared: shared))
        var requestHeaders = HTTPHeaders(headers)
        if let body { requestHeaders.add(name: "Content-Length", value: String(body.utf8.count)) }
        try channel.writeInbound(
            HTTPServerRequestPart.head(
                HTTPRequestHead(version: version, method: method, uri: uri, headers: requestHeaders)))
        if let body { try channel.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: body))) }
        try channel.writeInbound(HTTPServerRequestPart.end(nil))
        channel.embeddedEventLoop.run()
        var head: HTTPResponseHead?
        var text: String?
        while let part = try channel.readOutbound(as: HTTPServerResponsePart.self) {
            switch part {
            case .head(let h): head = h
            case .body(.byteBuffer(let b)): text = (text ?? "") + String(buffer: b)
            case .body, .end: break
            }
        }
        channel.embeddedEventLoop.run()
        return Written(head: try #require(head), body: text, closed: !channel.isActive)
    }

    @Test func aResponderAnswerGetsCORSLengthAndNosniff() throws {
        let written = try Self.exchange(.GET, "/healthz", headers: [("Origin", "http://a.example")])
        #expect(written.head.status == .ok)
        #expect(
            written.head.headers.map { "\($0.name): \($0.value)" } == [
                "Content-Type: text/plain; charset=utf-8", "Cache-Control: no-store",
                "Access-Control-Allow-Origin: http://a.example", "Access-Control-Allow-Credentials: true",
                "Content-Length: 3", "X-Content-Type-Options: nosniff",
            ])
        #expect(written.body == "ok\n")
        #expect(!written.closed)
    }

    @Test func theAPIGetsNoCORSHeaders() throws {
        let written = try Self.exchange(
            .GET, "/api/channels", headers: [("Origin", "http://a.example"), ("Authorization", "apikey \(Self.key)")])
        #expect(written.head.status == .ok)
        #expect(!written.head.headers.contains(name: "access-control-allow-origin"))
        #expect(written.body == "{\"channels\":[]}\n")
    }

    @Test func aHEADGetsTheLengthWithoutTheBody() throws {
        let written = try Self.exchange(.HEAD, "/faye/client.js")
        #expect(written.head.status == .ok)
        #expect(written.head.headers["content-length"] == [String(StaticFiles.clientBody.readableBytes)])
        #expect(written.body == nil)
    }

    @Test func aRequestThatIsNotKeptAliveIsClosedAfterItsAnswer() throws {
        let written = try Self.exchange(.GET, "/nope", version: .http1_0)
        #expect(written.head.status == .notFound)
        #expect(written.head.headers["connection"] == ["close"])
        #expect(written.body == "Sure you're not looking for /faye ?")
        #expect(written.closed)
    }

    @Test func aBodyOverTheLimitIsAnswered413BeforeAnyRoute() throws {
        let written = try Self.exchange(
            .POST, "/api/publish", headers: [("Authorization", "apikey \(Self.key)")],
            body: String(repeating: "x", count: 11),
            shared: Self.makeShared(maxRequestBytes: 10))
        #expect(written.head.status == .payloadTooLarge)
        #expect(written.head.headers["connection"] == ["close"])
        #expect(written.body == "Request body too large (limit 10 bytes)\n")
    }
}
