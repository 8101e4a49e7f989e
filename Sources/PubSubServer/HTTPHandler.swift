import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import PubSubCore

/// Serves one HTTP connection: long-polling (POST), cross-origin long-polling (CORS), JSON-P callback-polling
/// (GET), EventSource streams, CORS preflights, and the few plain routes.
final class HTTPHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let shared: ServerShared
    private let makeUpgradeHandler: () -> HTTPServerUpgradeHandler
    /// Whether an upgrade handler stands in front of this one, waiting for the next request.
    private var upgradeArmed = true
    private var context: ChannelHandlerContext?
    private var head: HTTPRequestHead?
    private var body: ByteBuffer?
    private var rejected = false
    private var parked: LongPollSink? {
        didSet {
            if let oldValue, oldValue !== parked { counters?.detached(oldValue.connectionType) }
            if let parked, parked !== oldValue { counters?.attached(parked.connectionType) }
        }
    }
    private var stream: EventSourceSink? {
        didSet {
            if oldValue != nil, stream == nil { counters?.detached(.eventSource) }
            if oldValue == nil, stream != nil { counters?.attached(.eventSource) }
        }
    }
    /// This loop's counters (bytes out, attached clients).
    private var counters: LoopCounters?
    /// The `X-RateLimit-*` headers of the publish request being answered.
    private var rateLimitHeaders: HTTPHeaders?

    init(shared: ServerShared, makeUpgradeHandler: @escaping () -> HTTPServerUpgradeHandler) {
        self.shared = shared
        self.makeUpgradeHandler = makeUpgradeHandler
    }

    /// Puts an upgrade handler back in front of this one, so the next request may be a WebSocket upgrade.
    private func rearmUpgrade(context: ChannelHandlerContext) {
        guard !upgradeArmed else { return }
        upgradeArmed = true
        try? context.pipeline.syncOperations.addHandler(makeUpgradeHandler(), position: .before(self))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        counters = shared.operations.loopCounters.counters(for: context.eventLoop)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // After a 413 the rest of the body is cut off: that problem has been reported already.
        if reportConnectionError(error, context: context, alreadyReported: rejected) { context.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func channelInactive(context: ChannelHandlerContext) {
        if let parked { parked.connectionClosed() }
        if let stream { stream.connectionClosed() }
        parked = nil
        stream = nil
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            // The upgrade handler passed this request on and left the pipeline.
            upgradeArmed = false
            self.head = head
            body = nil
            rejected = false
            if let length = head.headers.first(name: "content-length").flatMap(Int.init),
                length > shared.configuration.maxRequestBytes
            {
                rejectTooLarge(context: context)
            }
        case .body(var chunk):
            guard !rejected else { return }
            if (body?.readableBytes ?? 0) + chunk.readableBytes > shared.configuration.maxRequestBytes {
                rejectTooLarge(context: context)
                return
            }
            if body == nil { body = chunk } else { body!.writeBuffer(&chunk) }
        case .end:
            guard !rejected, let head else { return }
            route(head, context: context)
        }
    }

    private func rejectTooLarge(context: ChannelHandlerContext) {
        rejected = true
        body = nil
        shared.operations.metrics.error(.payloadTooLarge)
        shared.logger.info(
            "request body over the limit",
            metadata: ["pubsub.limit": "\(shared.configuration.maxRequestBytes)"])
        respond(
            status: .payloadTooLarge,
            text: "Request body too large (limit \(shared.configuration.maxRequestBytes) bytes)\n",
            close: true)
    }

    private func route(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
        switch Route(path: head.uri, mount: shared.mount) {
        case .notFound:
            respond(status: .notFound, text: "Sure you're not looking for \(shared.mount.isEmpty ? "/" : shared.mount) ?")
        case .health:
            respond(status: .ok, text: "ok\n")
        case .ready, .metrics:
            let route = Route(path: head.uri, mount: shared.mount)
            guard let response = shared.operationalResponse(route, onMetricsPort: false, on: context.eventLoop) else {
                respond(status: .notFound, text: "Not found\n")
                return
            }
            response.assumeIsolated().whenSuccess { status, headers, body in
                self.respond(status: status, headers: headers, body: body)
            }
        case .staticFile(let name):
            if let file = StaticFiles.response(name: name, method: head.method, requestHeaders: head.headers) {
                respond(status: file.status, headers: file.headers, body: file.body)
            } else {
                respond(status: .notFound, text: "No such file: \(name)\n")
            }
        case .bayeux, .bayeuxWithSuffix:
            if let refusal = browserAccessRefusal(head) {
                respond(status: .forbidden, headers: ["Content-Type": "text/plain; charset=utf-8"],
                    body: ByteBuffer(string: refusal), cors: false)
            } else if head.method == .OPTIONS || head.headers.contains(name: "access-control-request-method") {
                preflight(head)
            } else if head.method == .GET,
                head.headers["accept"].contains(where: { $0.lowercased().contains("text/event-stream") })
            {
                openEventSource(head)
            } else if head.method == .GET {
                callbackPolling(head)
            } else {
                longPolling(head)
            }
        }
    }

    // MARK: Sources of messages

    private func queryValue(_ name: String, in head: HTTPRequestHead) -> [UInt8]? {
        guard let q = head.uri.firstIndex(of: "?") else { return nil }
        return FormData.value(of: name, in: head.uri.utf8[head.uri.utf8.index(after: q)...])
    }

    private func longPolling(_ head: HTTPRequestHead) {
        let bodyBytes = body.map { Array($0.readableBytesView) } ?? []
        var source: [UInt8]?
        if let fromQuery = queryValue("message", in: head) {
            source = fromQuery
        } else if Self.isJSONContentType(head.headers.first(name: "content-type")) {
            source = bodyBytes
        } else if let field = FormData.value(of: "message", in: bodyBytes) {
            source = field
        } else if let firstByte = bodyBytes.first(where: { ![0x20, 0x09, 0x0A, 0x0D].contains($0) }),
            firstByte == UInt8(ascii: "{") || firstByte == UInt8(ascii: "[")
        {
            // A raw JSON body sent with another content type (curl -d sends a form type).
            source = bodyBytes
        }
        guard let source else {
            badRequest("no message in request")
            return
        }
        process(source, head: head, jsonp: nil)
    }

    static func isJSONContentType(_ value: String?) -> Bool {
        guard let value else { return false }
        let media = value.split(separator: ";").first.map { String($0.filter { $0 != " " && $0 != "\t" }).lowercased() }
        return media == "application/json"
    }

    private func callbackPolling(_ head: HTTPRequestHead) {
        guard let message = queryValue("message", in: head) else {
            badRequest("GET without message")
            return
        }
        let callback = queryValue("jsonp", in: head) ?? Array("jsonpcallback".utf8)
        guard JSONPCallback.isValid(callback) else {
            badRequest("invalid JSON-P callback")
            return
        }
        process(message, head: head, jsonp: String(decoding: callback, as: UTF8.self))
    }

    // MARK: Bayeux over HTTP

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
        if elements.isEmpty {
            respondBayeux(replies: [], events: [], jsonp: jsonp)
            return
        }
        rateLimitHeaders = nil
        if let limits = checkPublishLimits(elements, head: head, remoteAddress: context.channel.remoteAddress?.ipAddress) {
            if let (status, headers, body) = limits.refusal {
                respond(status: status, headers: headers, body: body)
                return
            }
            rateLimitHeaders = limits.headers
        }
        let connectionType: ConnectionType = jsonp != nil ? .callbackPolling
            : head.headers.contains(name: "origin") ? .crossOriginLongPolling : .longPolling
        let requestContext = RequestContext(
            connectionType: connectionType, remoteAddress: context.channel.remoteAddress?.ipAddress,
            headers: RequestContext.authorizationHeaders(head.headers))
        let sink = LongPollSink(handler: NIOLoopBound(self, eventLoop: context.eventLoop), jsonp: jsonp,
            context: requestContext, broker: shared.broker)
        let broker = shared.broker
        broker.handle(elements, context: requestContext, sink: sink, now: .now(), on: context.eventLoop)
            .assumeIsolated().whenComplete { result in
                switch result {
                case .failure(let error):
                    self.shared.operations.metrics.error(.serverError)
                    self.shared.logger.error("request failed", metadata: ["pubsub.error": "\(error)"])
                    self.respond(status: .internalServerError, text: "Internal server error\n")
                case .success(let outcomes):
                    let (replies, events, pending) = broker.split(outcomes, context: requestContext)
                    if let pending, pending.result.attached {
                        self.parked = sink
                        sink.park(pending, replies: replies)
                        // Draining: nothing is held, the client is told to retry (elsewhere).
                        if self.shared.operations.isDraining { sink.release() }
                    } else {
                        self.respondBayeux(replies: replies, events: events, jsonp: jsonp)
                    }
                }
            }
    }

    /// Called by the parked sink when its connect is answered.
    func answerParked(_ sink: LongPollSink, replies: [Message], events: CircularBuffer<ByteBuffer>) {
        guard parked === sink else { return }
        parked = nil
        respondBayeux(replies: replies, events: events, jsonp: sink.jsonp)
    }

    private func respondBayeux(replies: [Message], events: CircularBuffer<ByteBuffer>, jsonp: String?) {
        guard let context else { return }
        var payload = ReplyEncoder.encode(replies: replies, events: events, allocator: context.channel.allocator)
        var headers = HTTPHeaders()
        if let jsonp {
            payload = ReplyEncoder.escapeLineSeparators(payload, allocator: context.channel.allocator)
            var wrapped = context.channel.allocator.buffer(capacity: payload.readableBytes + jsonp.utf8.count + 8)
            wrapped.writeString("/**/\(jsonp)(")
            wrapped.writeBuffer(&payload)
            wrapped.writeString(");")
            payload = wrapped
            headers.add(name: "Content-Type", value: "text/javascript; charset=utf-8")
            headers.add(name: "Content-Disposition", value: "attachment; filename=f.txt")
        } else {
            headers.add(name: "Content-Type", value: "application/json; charset=utf-8")
        }
        headers.add(name: "Cache-Control", value: "no-cache, no-store")
        headers.add(name: "X-Content-Type-Options", value: "nosniff")
        if let rateLimitHeaders {
            headers.add(contentsOf: rateLimitHeaders)
            self.rateLimitHeaders = nil
        }
        respond(status: .ok, headers: headers, body: payload)
    }

    // MARK: EventSource

    private func openEventSource(_ head: HTTPRequestHead) {
        guard let context else { return }
        let clientId: String
        if case .bayeuxWithSuffix(let id) = Route(path: head.uri, mount: shared.mount), !id.isEmpty {
            clientId = id
        } else {
            badRequest("EventSource URL must end in the client id")
            return
        }
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/event-stream")
        headers.add(name: "Cache-Control", value: "no-cache, no-store")
        headers.add(name: "Connection", value: "close")
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: .ok, headers: headers))),
            promise: nil)
        context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "retry: 5000\r\n\r\n")))),
            promise: nil)
        let sink = EventSourceSink(handler: NIOLoopBound(self, eventLoop: context.eventLoop), clientId: clientId,
            engine: shared.broker.engine)
        stream = sink
        shared.broker.engine.attach(clientId, sink: sink, on: context.eventLoop).assumeIsolated().whenSuccess { attached in
            if !attached { self.endStream(sink) }
        }
    }

    func writeStream(_ sink: EventSourceSink, events: CircularBuffer<ByteBuffer>) {
        guard stream === sink, let context else { return }
        var bytes = 0
        for event in events { bytes += event.readableBytes + 10 }
        counters?.bytesOut &+= UInt64(bytes)
        for event in events {
            context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "data: ")))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(event))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "\r\n\r\n")))), promise: nil)
        }
        context.flush()
    }

    func endStream(_ sink: EventSourceSink) {
        guard stream === sink, let context else { return }
        stream = nil
        context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }

    // MARK: Plain responses

    private func preflight(_ head: HTTPRequestHead) {
        var headers = HTTPHeaders()
        headers.add(name: "Access-Control-Allow-Credentials", value: "true")
        headers.add(
            name: "Access-Control-Allow-Headers", value: "Accept, Authorization, Content-Type, Pragma, X-Requested-With")
        headers.add(name: "Access-Control-Allow-Methods", value: "POST, GET")
        let origin = head.headers.first(name: "origin") ?? head.headers.first(name: "referer") ?? "*"
        headers.add(name: "Access-Control-Allow-Origin", value: origin)
        headers.add(name: "Access-Control-Max-Age", value: "86400")
        respond(status: .ok, headers: headers, body: ByteBuffer(), cors: false)
    }

    private func badRequest(_ reason: String) {
        shared.operations.metrics.error(.badRequest)
        shared.logger.debug("bad request", metadata: ["pubsub.reason": "\(reason)"])
        respond(status: .badRequest, text: "Bad request")
    }

    private func respond(status: HTTPResponseStatus, text: String, close: Bool = false) {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        respond(status: status, headers: headers, body: ByteBuffer(string: text), close: close)
    }

    private func respond(
        status: HTTPResponseStatus,
        headers: HTTPHeaders,
        body: ByteBuffer,
        cors: Bool = true,
        close: Bool = false
    ) {
        guard let context, let head else { return }
        var headers = headers
        if cors, let origin = head.headers.first(name: "origin") {
            headers.add(name: "Access-Control-Allow-Origin", value: origin)
            headers.add(name: "Access-Control-Allow-Credentials", value: "true")
        }
        headers.add(name: "Content-Length", value: String(body.readableBytes))
        let keepAlive = head.isKeepAlive && !close && !shared.operations.isDraining
        counters?.bytesOut &+= UInt64(body.readableBytes)
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))),
            promise: nil)
        if body.readableBytes > 0 { context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
        if keepAlive { rearmUpgrade(context: context) }
        let done = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        if !keepAlive { done.assumeIsolated().whenComplete { _ in context.close(promise: nil) } }
    }
}

/// A parked long-poll `/meta/connect`: answered by the first delivery, the end of its hold, or a detach.
final class LongPollSink: DeliverySink, @unchecked Sendable {
    // All state is touched on `eventLoop` only.
    private let handler: NIOLoopBound<HTTPHandler>
    let jsonp: String?
    private let context: RequestContext
    private let broker: Broker
    private var pending: PendingConnect?
    private var replies: [Message] = []
    private var timer: Scheduled<Void>?
    private var answered = false
    private var early = CircularBuffer<ByteBuffer>()
    private var earlyDetach: DetachReason?

    var eventLoop: any EventLoop { handler.eventLoop }
    var isPersistent: Bool { false }
    var connectionType: ConnectionType { context.connectionType }

    init(handler: NIOLoopBound<HTTPHandler>, jsonp: String?, context: RequestContext, broker: Broker) {
        self.handler = handler
        self.jsonp = jsonp
        self.context = context
        self.broker = broker
    }

    func park(_ pending: PendingConnect, replies: [Message]) {
        self.pending = pending
        self.replies = replies
        if !early.isEmpty || earlyDetach != nil {
            answer(events: early, reason: earlyDetach)
            return
        }
        timer = eventLoop.scheduleTask(in: pending.hold) { [self] in
            let events = broker.engine.detach(pending.clientId, sink: self, takeEvents: true)
            answer(events: events, reason: nil)
        }
    }

    func deliver(_ events: CircularBuffer<ByteBuffer>) {
        guard pending != nil else {
            early.append(contentsOf: events)
            return
        }
        answer(events: events, reason: nil)
    }

    func detached(_ reason: DetachReason) {
        guard pending != nil else {
            earlyDetach = reason
            return
        }
        answer(events: [], reason: reason)
    }

    /// Answers now with whatever is queued, as when the hold ends (a draining server holds nothing).
    func release() {
        guard !answered, let pending else { return }
        let events = broker.engine.detach(pending.clientId, sink: self, takeEvents: true)
        answer(events: events, reason: .shutdown)
    }

    func connectionClosed() {
        timer?.cancel()
        guard !answered, let pending else { return }
        answered = true
        _ = broker.engine.detach(pending.clientId, sink: self, takeEvents: false)
    }

    private func answer(events: CircularBuffer<ByteBuffer>, reason: DetachReason?) {
        guard !answered, let pending else { return }
        answered = true
        timer?.cancel()
        var reply = pending.reply
        if reason == .overflow {
            reply.fail(BayeuxError(.queueOverflow, pending.clientId))
            reply.clientId = nil
            reply["advice"] = Advice.handshake
        }
        var all = replies
        if let finished = broker.finish(reply, context: context) { all.append(finished) }
        handler.value.answerParked(self, replies: all, events: events)
    }
}

/// An EventSource stream: each event is written as `data: [<message>]` and a blank line.
final class EventSourceSink: DeliverySink, @unchecked Sendable {
    private let handler: NIOLoopBound<HTTPHandler>
    let clientId: String
    private let engine: any Engine
    private var open = true

    var eventLoop: any EventLoop { handler.eventLoop }
    var isPersistent: Bool { true }

    init(handler: NIOLoopBound<HTTPHandler>, clientId: String, engine: any Engine) {
        self.handler = handler
        self.clientId = clientId
        self.engine = engine
    }

    func deliver(_ events: CircularBuffer<ByteBuffer>) {
        guard open else { return }
        handler.value.writeStream(self, events: events)
    }

    func detached(_ reason: DetachReason) {
        guard open else { return }
        open = false
        handler.value.endStream(self)
    }

    func connectionClosed() {
        guard open else { return }
        open = false
        _ = engine.detach(clientId, sink: self, takeEvents: false)
    }
}
