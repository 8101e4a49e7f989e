import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import PubSubCore

/// Serves one HTTP connection: reads each request, parses its route once, and hands it to the route's responder
/// (`HTTPRouter`); serves the Bayeux mount itself (`BayeuxHTTPRequest`): long-polling (POST), cross-origin
/// long-polling (CORS), JSON-P callback-polling (GET), EventSource streams and CORS preflights. Its
/// `ConnectionDriver` decides when a parked connect is answered and what a stream carries; this handler writes
/// the responses and the stream.
final class HTTPHandler: ChannelInboundHandler, RemovableChannelHandler, ConnectionTransport {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let shared: ServerShared
    private(set) var context: ChannelHandlerContext?
    private var reader: HTTPRequestReader
    /// What the response to the current request needs from its head, kept until it is answered.
    private var target: ResponseTarget?
    /// Performs what the connection's `ConnectionStateMachine` decides; set when this handler joins the pipeline.
    private(set) var driver: ConnectionDriver!
    /// The JSON-P callback of the request being handled or parked.
    private var jsonp: String?
    /// The peer's IP address, read once (nil until read; `.some(nil)` when the channel has none).
    private var remoteIP: String??
    /// The `X-RateLimit-*` headers of the publish request being answered.
    private var rateLimitHeaders: HTTPHeaders?
    /// An upgrade refused (`acceptsUpgrade`): its request comes here next, and is served with this route.
    private var refusedUpgrade: (uri: String, route: Route)?

    init(shared: ServerShared) {
        self.shared = shared
        self.reader = HTTPRequestReader(maxBytes: shared.configuration.maxRequestBytes)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        driver = ConnectionDriver(
            transport: self, context: RequestContext(connectionType: .longPolling), shared: shared,
            eventLoop: context.eventLoop)
        driver.opened()
        if !context.channel.isWritable { driver.writabilityChanged(isWritable: false) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // After a 413 the rest of the body is cut off: that problem has been reported already.
        if reportConnectionError(error, context: context, alreadyReported: reader.rejected) {
            context.close(promise: nil)
        }
    }

    /// Also on a WebSocket upgrade, which takes this handler out of the pipeline.
    func handlerRemoved(context: ChannelHandlerContext) {
        driver.closed()
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        driver.closed()
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        driver.writabilityChanged(isWritable: context.channel.isWritable)
        context.fireChannelWritabilityChanged()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        if case .head(let head) = part { target = ResponseTarget(head) }
        switch reader.read(part) {
        case .reading: break
        case .tooLarge: rejectTooLarge(context: context)
        case .request(let head, let body):
            route(
                RoutedRequest(
                    head: head, body: body, route: route(of: head), peerAddress: peerAddress(context: context)),
                context: context)
        }
    }

    /// Whether a request that asks for a WebSocket upgrade gets one: the Bayeux mount, from an allowed origin.
    /// Asked by the upgrader in front of this handler; a refused request comes here next (the upgrader hands it
    /// on) and is served with the route parsed here: a 404, a 403 for an origin that is not allowed.
    func acceptsUpgrade(_ head: HTTPRequestHead) -> Bool {
        let route = Route(path: head.uri, mount: shared.mount)
        switch route {
        case .bayeux, .bayeuxWithSuffix:
            if shared.configuration.origins.allows(head.headers) { return true }
        default:
            break
        }
        refusedUpgrade = (head.uri, route)
        return false
    }

    /// The route of a request: parsed once, by `acceptsUpgrade` already for a refused upgrade.
    private func route(of head: HTTPRequestHead) -> Route {
        defer { refusedUpgrade = nil }
        if let refusedUpgrade, refusedUpgrade.uri == head.uri { return refusedUpgrade.route }
        return Route(path: head.uri, mount: shared.mount)
    }

    private func rejectTooLarge(context: ChannelHandlerContext) {
        shared.operations.metrics.error(.payloadTooLarge)
        shared.logger.info(
            "request body over the limit",
            metadata: ["pubsub.limit": "\(shared.configuration.maxRequestBytes)"])
        respond(
            .text(.payloadTooLarge, "Request body too large (limit \(shared.configuration.maxRequestBytes) bytes)\n"),
            close: true)
    }

    private func route(_ request: RoutedRequest, context: ChannelHandlerContext) {
        switch HTTPRouter(shared: shared).reply(to: request, on: context.eventLoop) {
        case .now(let response): respond(response)
        case .later(let response): response.assumeIsolated().whenSuccess { self.respond($0) }
        case nil: serveBayeux(request)
        }
    }

    /// The peer's IP address, read once per connection.
    private func peerAddress(context: ChannelHandlerContext) -> String? {
        if let known = remoteIP { return known }
        let address = context.channel.remoteAddress?.ipAddress
        remoteIP = .some(address)
        return address
    }

    // MARK: The Bayeux mount

    private func serveBayeux(_ request: RoutedRequest) {
        switch BayeuxHTTPRequest(request, configuration: shared.configuration, logger: shared.logger) {
        case .respond(let response): respond(response)
        case .badRequest(let reason): badRequest(reason)
        case .eventSource(let clientId): openEventSource(clientId, version: request.head.version)
        case .messages(let source, let jsonp): process(source, head: request.head, jsonp: jsonp)
        }
    }

    private func process(_ source: [UInt8], head: HTTPRequestHead, jsonp: String?) {
        guard let context else { return }
        let value: JSONValue
        do {
            value = try JSONParser(maxDepth: shared.configuration.maxJSONDepth).parse(source)
        } catch {
            badRequest("\(error)")
            return
        }
        guard let elements = MessageBatch.elements(of: value) else {
            badRequest("top-level JSON must be an object or an array")
            return
        }
        self.jsonp = jsonp
        if elements.isEmpty {
            send(replies: [], events: [])
            return
        }
        rateLimitHeaders = nil
        let remoteIP = peerAddress(context: context)
        if let limits = checkPublishLimits(elements, head: head, remoteAddress: remoteIP) {
            if let refusal = limits.refusal {
                respond(refusal)
                return
            }
            rateLimitHeaders = limits.headers
        }
        let connectionType: ConnectionType =
            jsonp != nil
            ? .callbackPolling
            : head.headers.contains(name: "origin") ? .crossOriginLongPolling : .longPolling
        driver.handle(
            elements,
            context: RequestContext(
                connectionType: connectionType, remoteAddress: remoteIP,
                headers: RequestContext.authorizationHeaders(head.headers)))
    }

    // MARK: ConnectionTransport

    /// A response with replies and events, or events on the stream.
    func send(replies: [Message], events: CircularBuffer<WireEvent>) {
        guard let context else { return }
        guard driver.isStream else {
            var response = BayeuxHTTPResponse.messages(
                replies: replies, events: events, jsonp: jsonp, allocator: context.channel.allocator)
            if let rateLimitHeaders {
                response.headers.add(contentsOf: rateLimitHeaders)
                self.rateLimitHeaders = nil
            }
            respond(response)
            return
        }
        writeStream(events, context: context)
    }

    func resumeReading() { context?.read() }

    func requestFailed(_ error: any Error) {
        shared.operations.metrics.error(.serverError)
        shared.logger.error("request failed", metadata: ["pubsub.error": "\(error)"])
        respond(.text(.internalServerError, "Internal server error\n"))
    }

    // MARK: Plain responses

    private func badRequest(_ reason: String) {
        shared.operations.metrics.error(.badRequest)
        shared.logger.debug("bad request", metadata: ["pubsub.reason": "\(reason)"])
        respond(.text(.badRequest, "Bad request"))
    }

    /// Writes a response with what every response carries; `close` ends the connection after it.
    private func respond(_ response: HTTPResponse, close: Bool = false) {
        guard let context, let target else { return }
        let keepAlive = target.keepAlive && !close && !shared.operations.isDraining
        let (head, body) = target.complete(response, keepAlive: keepAlive)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if let body {
            driver.counters.bytesOut &+= UInt64(body.readableBytes)
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        }
        guard !keepAlive else {
            // No promise: nothing waits for the write of a kept-alive response.
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            return
        }
        // A close with the request half read (a 413) lingers in the connection guard: the client reads the
        // status instead of a reset.
        context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }
}

/// Reading waits while writes drain (the connection's outbound bytes are over `maxOutboundBytes`).
extension HTTPHandler: ChannelOutboundHandler {
    typealias OutboundIn = HTTPServerResponsePart

    func read(context: ChannelHandlerContext) {
        if driver.readRequested() { context.read() }
    }
}
