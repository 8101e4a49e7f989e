import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import PubSubCore

/// Serves one HTTP connection: reads each request, parses its route once, and hands it to the route's responder
/// (`HTTPRouter`); serves the Bayeux mount itself: long-polling (POST), cross-origin long-polling (CORS), JSON-P
/// callback-polling (GET), EventSource streams and CORS preflights.
final class HTTPHandler: ChannelInboundHandler, RemovableChannelHandler, TimerQueueOwner {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let shared: ServerShared
    private var context: ChannelHandlerContext?
    /// The head and body of the request being read, let go once it is routed: a parked connect keeps neither
    /// (the body is a slice of a whole receive buffer, the head carries every header and the URI).
    private var head: HTTPRequestHead?
    private var body: ByteBuffer?
    /// What the response to the current request needs from its head, kept until it is answered.
    private var target: ResponseTarget?
    private var rejected = false
    /// The Bayeux delivery of this connection: a parked connect, or an EventSource stream once one is opened.
    private var machine: ConnectionStateMachine
    /// The sink offered to the connect of the request being handled, parked, or of the stream.
    private var sink: ConnectionSink?
    /// How the parked connect or the stream came (counted as attached while it lasts).
    private var attachedType: ConnectionType? {
        didSet {
            if let oldValue, oldValue != attachedType { counters?.detached(oldValue) }
            if let attachedType, attachedType != oldValue { counters?.attached(attachedType) }
        }
    }
    /// The JSON-P callback of the request whose connect is parked.
    private var parkedJSONP: String?
    /// The request context of the parked connect (for the outgoing extensions of its reply).
    private var pollContext: RequestContext?
    /// The timers of this connection's loop: the hold of a parked connect is an entry there.
    private var timers: LoopTimers?
    var timerQueueIndex = -1
    /// When the hold of the parked connect ends. Its entry in `timers` may be earlier, left by a hold answered
    /// before (it then fires early and is moved here, as the connection guard's does), never later: answering
    /// a poll and parking the next take no timer heap work.
    private var holdDeadline: NIODeadline?
    private var heartbeat: Scheduled<Void>?
    private var streamEnded = false
    /// This loop's counters (bytes out, attached clients).
    private var counters: LoopCounters?
    /// The peer's IP address, read once (nil until read; `.some(nil)` when the channel has none).
    private var remoteIP: String??
    /// The `X-RateLimit-*` headers of the publish request being answered.
    private var rateLimitHeaders: HTTPHeaders?

    init(shared: ServerShared) {
        self.shared = shared
        self.machine = ConnectionStateMachine(transport: .polling, maxQueue: shared.configuration.broker.maxQueue)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        timers = shared.guardSettings.loopTimers.timers(for: context.eventLoop)
        counters = shared.operations.loopCounters.counters(for: context.eventLoop)
        if !context.channel.isWritable { perform(machine.writabilityChanged(isWritable: false), context: context) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // After a 413 the rest of the body is cut off: that problem has been reported already.
        if reportConnectionError(error, context: context, alreadyReported: rejected) { context.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timers?.cancel(self)
        self.context = nil
    }

    /// The hold of the parked connect ended.
    func timerQueueDeadlineReached() {
        guard let context, let holdDeadline else { return }
        if context.eventLoop.now < holdDeadline {
            timers?.schedule(self, at: holdDeadline)
            return
        }
        self.holdDeadline = nil
        perform(machine.holdTimerFired(), context: context)
    }

    func channelInactive(context: ChannelHandlerContext) {
        perform(machine.closed(), context: context)
        releaseSink()
        heartbeat?.cancel()
        heartbeat = nil
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        perform(machine.writabilityChanged(isWritable: context.channel.isWritable), context: context)
        context.fireChannelWritabilityChanged()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            target = ResponseTarget(head)
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
            let request = RoutedRequest(
                head: head, body: body, route: Route(path: head.uri, mount: shared.mount),
                peerAddress: peerAddress(context: context))
            self.head = nil
            body = nil
            route(request, context: context)
        }
    }

    private func rejectTooLarge(context: ChannelHandlerContext) {
        rejected = true
        body = nil
        shared.operations.metrics.error(.payloadTooLarge)
        shared.logger.info(
            "request body over the limit",
            metadata: ["pubsub.limit": "\(shared.configuration.maxRequestBytes)"])
        respond(.text(.payloadTooLarge, "Request body too large (limit \(shared.configuration.maxRequestBytes) bytes)\n"),
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
        let head = request.head
        if head.method == .HEAD {
            // A HEAD carries no message to run and opens no stream; saying so is the honest answer.
            var headers = HTTPHeaders()
            headers.add(name: "Allow", value: "GET, POST, OPTIONS")
            headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
            respond(HTTPResponse(status: .methodNotAllowed, headers: headers, body: ByteBuffer(string: "Method not allowed\n")))
        } else if let refusal = browserAccessRefusal(head) {
            var forbidden = HTTPResponse.text(.forbidden, refusal)
            forbidden.crossOrigin = false
            respond(forbidden)
        } else if head.method == .OPTIONS || head.headers.contains(name: "access-control-request-method") {
            preflight(head)
        } else if head.method == .GET,
            head.headers["accept"].contains(where: { $0.lowercased().contains("text/event-stream") })
        {
            openEventSource(request)
        } else if head.method == .GET {
            callbackPolling(head)
        } else {
            longPolling(request)
        }
    }

    // MARK: Sources of messages

    private func queryValue(_ name: String, in head: HTTPRequestHead) -> [UInt8]? {
        guard let q = head.uri.firstIndex(of: "?") else { return nil }
        return FormData.value(of: name, in: head.uri.utf8[head.uri.utf8.index(after: q)...])
    }

    private func longPolling(_ request: RoutedRequest) {
        let head = request.head
        let bodyBytes = request.body.map { Array($0.readableBytesView) } ?? []
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
        // What clients send, told without splitting and lowercasing.
        if value == "application/json" || value == "application/json; charset=utf-8" { return true }
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
        let remoteIP = peerAddress(context: context)
        if let limits = checkPublishLimits(elements, head: head, remoteAddress: remoteIP) {
            if let refusal = limits.refusal {
                respond(refusal)
                return
            }
            rateLimitHeaders = limits.headers
        }
        let connectionType: ConnectionType = jsonp != nil ? .callbackPolling
            : head.headers.contains(name: "origin") ? .crossOriginLongPolling : .longPolling
        let requestContext = RequestContext(
            connectionType: connectionType, remoteAddress: remoteIP,
            headers: RequestContext.authorizationHeaders(head.headers))
        let sink = ConnectionSink(owner: self, isPersistent: false, eventLoop: context.eventLoop)
        releaseSink()
        self.sink = sink
        machine.requestStarted()
        let broker = shared.broker
        broker.handle(elements, context: requestContext, sink: sink, now: .now(), on: context.eventLoop)
            .assumeIsolated().whenComplete { result in
                guard self.sink === sink else {
                    // The connection closed while the broker worked: a connect that attached the sink lets go.
                    if case .success(let outcomes) = result {
                        for case .connect(let pending) in outcomes where pending.result.attached {
                            broker.detach(pending.clientId, sink: sink, takeEvents: false)
                        }
                    }
                    return
                }
                switch result {
                case .failure(let error):
                    self.releaseSink()
                    self.shared.operations.metrics.error(.serverError)
                    self.shared.logger.error("request failed", metadata: ["pubsub.error": "\(error)"])
                    self.respond(.text(.internalServerError, "Internal server error\n"))
                case .success(let outcomes):
                    let (replies, events, pending) = broker.split(outcomes, context: requestContext)
                    self.parkedJSONP = jsonp
                    self.pollContext = requestContext
                    if pending?.result.attached == true { self.attachedType = connectionType }
                    self.perform(
                        self.machine.messagesHandled(replies: replies, events: events, pending: pending),
                        context: context)
                    if self.machine.isHolding {
                        // Draining: nothing is held, the client is told to retry (elsewhere).
                        if self.shared.operations.isDraining { self.perform(self.machine.quiesce(), context: context) }
                    } else if self.sink === sink {
                        self.releaseSink()
                    }
                }
            }
    }

    /// Lets go of the current sink: its calls are no longer wanted (answered, rebound, closed).
    private func releaseSink() {
        sink?.closed = true
        sink = nil
        attachedType = nil
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
        respond(HTTPResponse(status: .ok, headers: headers, body: payload))
    }

    // MARK: EventSource

    private func openEventSource(_ request: RoutedRequest) {
        guard let context else { return }
        guard case .bayeuxWithSuffix(let clientId) = request.route, !clientId.isEmpty else {
            badRequest("EventSource URL must end in the client id")
            return
        }
        let head = request.head
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/event-stream")
        headers.add(name: "Cache-Control", value: "no-cache, no-store")
        headers.add(name: "Connection", value: "close")
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: .ok, headers: headers))),
            promise: nil)
        context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "retry: 5000\r\n\r\n")))),
            promise: nil)
        releaseSink()
        let sink = ConnectionSink(owner: self, isPersistent: true, eventLoop: context.eventLoop)
        self.sink = sink
        attachedType = .eventSource
        machine.streamOpened(clientId: clientId)
        scheduleHeartbeat(context: context)
        shared.broker.attach(clientId, sink: sink, on: context.eventLoop).assumeIsolated().whenSuccess { attached in
            if !attached, self.sink === sink { self.endStream(context: context) }
        }
    }

    /// The next heartbeat of the stream, every `pingInterval`.
    private func scheduleHeartbeat(context: ChannelHandlerContext) {
        let interval = shared.configuration.pingInterval
        guard interval > .zero else { return }
        heartbeat = context.eventLoop.assumeIsolated().scheduleTask(in: interval) { [weak self] in
            guard let self, let context = self.context, !self.streamEnded else { return }
            self.perform(self.machine.heartbeatDue(), context: context)
            self.scheduleHeartbeat(context: context)
        }
    }

    private static let dataPrefix = ByteBuffer(string: "data: ")
    private static let eventEnd = ByteBuffer(string: "\r\n\r\n")
    private static let heartbeatLine = ByteBuffer(string: ":\n\n")

    private func writeStream(_ events: CircularBuffer<ByteBuffer>, context: ChannelHandlerContext) {
        var bytes = 0
        for event in events { bytes += event.readableBytes + 10 }
        counters?.bytesOut &+= UInt64(bytes)
        for event in events {
            context.write(wrapOutboundOut(.body(.byteBuffer(Self.dataPrefix))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(event))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(Self.eventEnd))), promise: nil)
        }
        context.flush()
    }

    private func endStream(context: ChannelHandlerContext) {
        guard !streamEnded else { return }
        streamEnded = true
        releaseSink()
        heartbeat?.cancel()
        heartbeat = nil
        machine.closing()
        context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }

    // MARK: Delivery

    func deliver(_ sink: ConnectionSink, events: CircularBuffer<ByteBuffer>) {
        guard sink === self.sink, let context else { return }
        switch machine.eventsDelivered(events) {
        case .none: break
        case .write(let events): perform([.write(replies: [], events: events)], context: context)
        case .answer(let answer): self.answer(answer, context: context)
        case .drop(let clientId): perform([.drop(clientId: clientId)], context: context)
        }
    }

    func detached(_ sink: ConnectionSink, reason: DetachReason) {
        guard sink === self.sink, let context else { return }
        if reason == .overflow {
            let clientId = machine.clientId ?? machine.heldClientId
            if let clientId { shared.broker.logDropped(clientId, transport: attachedType ?? .longPolling) }
        }
        if machine.transport == .eventSource { releaseSink() }
        perform(machine.detached(reason), context: context)
    }

    private func perform(_ actions: [ConnectionStateMachine.Action], context: ChannelHandlerContext) {
        for action in actions {
            switch action {
            case .write(let replies, let events):
                if machine.transport == .eventSource {
                    writeStream(events, context: context)
                } else {
                    respondBayeux(replies: replies, events: events, jsonp: parkedJSONP)
                }
            case .answer(let answer):
                self.answer(answer, context: context)
            case .armHoldTimer(let hold):
                let deadline = context.eventLoop.now + hold
                holdDeadline = deadline
                if let armed = timers?.deadline(of: self), armed <= deadline { break }
                timers?.schedule(self, at: deadline)
            case .cancelHoldTimer:
                holdDeadline = nil
            case .resumeReading:
                context.read()
            case .detach(let clientId):
                if let sink { shared.broker.detach(clientId, sink: sink, takeEvents: false) }
                releaseSink()
            case .drop(let clientId):
                releaseSink()
                shared.broker.drop(clientId, transport: .eventSource, on: context.eventLoop)
                endStream(context: context)
            case .close:
                endStream(context: context)
            case .heartbeat:
                counters?.bytesOut &+= UInt64(Self.heartbeatLine.readableBytes)
                context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(Self.heartbeatLine))), promise: nil)
            }
        }
    }

    /// Answers the parked connect: its hold ended, a delivery or a detach came, or the server drains.
    private func answer(_ answer: ConnectionStateMachine.Answer, context: ChannelHandlerContext) {
        holdDeadline = nil
        var events = answer.events
        if answer.takeEvents, let sink {
            events.append(contentsOf: shared.broker.detach(answer.connect.clientId, sink: sink, takeEvents: true))
        }
        releaseSink()
        let reply = answer.reply
        var replies = answer.replies
        let requestContext = pollContext ?? RequestContext(connectionType: .longPolling, remoteAddress: nil)
        if let finished = shared.broker.finish(reply, context: requestContext) { replies.append(finished) }
        respondBayeux(replies: replies, events: events, jsonp: parkedJSONP)
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
        respond(HTTPResponse(status: .ok, headers: headers, body: ByteBuffer(), crossOrigin: false))
    }

    private func badRequest(_ reason: String) {
        shared.operations.metrics.error(.badRequest)
        shared.logger.debug("bad request", metadata: ["pubsub.reason": "\(reason)"])
        respond(.text(.badRequest, "Bad request"))
    }

    /// Writes a response with what every response carries; `close` ends the connection after it.
    private func respond(_ response: HTTPResponse, close: Bool = false) {
        guard let context, let target else { return }
        let (status, body) = (response.status, response.body)
        var headers = response.headers
        if response.crossOrigin, let origin = target.origin {
            headers.add(name: "Access-Control-Allow-Origin", value: origin)
            headers.add(name: "Access-Control-Allow-Credentials", value: "true")
        }
        // The length a GET would have, on a HEAD too, whose body is not sent.
        headers.add(name: "Content-Length", value: String(body.readableBytes))
        if !headers.contains(name: "x-content-type-options") { headers.add(name: "X-Content-Type-Options", value: "nosniff") }
        let keepAlive = target.keepAlive && !close && !shared.operations.isDraining
        let sendsBody = body.readableBytes > 0 && !target.isHEAD
        if sendsBody { counters?.bytesOut &+= UInt64(body.readableBytes) }
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: target.version, status: status, headers: headers))),
            promise: nil)
        if sendsBody { context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
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

extension HTTPHandler {
    /// What a response needs from its request's head: a few fields instead of the head's headers and URI.
    struct ResponseTarget {
        var version: HTTPVersion
        var keepAlive: Bool
        var isHEAD: Bool
        /// The request's `Origin`, echoed on CORS responses.
        var origin: String?

        init(_ head: HTTPRequestHead) {
            version = head.version
            keepAlive = head.isKeepAlive
            isHEAD = head.method == .HEAD
            origin = head.headers.first(name: "origin")
        }
    }
}

/// Reading waits while writes drain (the connection's outbound bytes are over `maxOutboundBytes`).
extension HTTPHandler: ChannelOutboundHandler, ConnectionSinkOwner {
    typealias OutboundIn = HTTPServerResponsePart

    func read(context: ChannelHandlerContext) {
        if machine.readRequested() == .read { context.read() }
    }
}
