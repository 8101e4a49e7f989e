import NIOCore
import NIOHTTP1
import NIOPosix

/// Bayeux long-polling over HTTP/1.1: each body is POSTed as `application/json`, one request outstanding at a
/// time (bodies sent meanwhile wait their turn, in order), each response body handed to the client whole.
///
/// Keep-alive is used while the server keeps the connection; a server that closes it after a response (puma
/// does, without saying `Connection: close`) gets a new connection for the next request, and a request that
/// died before any response byte arrived is sent again on the new connection, as browsers and curl do.
final class LongPollWire: BenchWire {
    private let client: BenchClient
    private var handler: LongPollHandler?
    private var connecting = false
    private var closed = false
    private var everConnected = false
    private var waiting = CircularBuffer<ByteBuffer>()
    /// The body of the request in flight, kept until its response starts.
    private var inFlight: ByteBuffer?
    private var responseStarted = false
    private var status: HTTPResponseStatus = .ok
    private var body: ByteBuffer?
    private var resends = 0
    let hostHeader: String
    let path: String

    private init(client: BenchClient) {
        self.client = client
        let url = client.target
        self.hostHeader = "\(url.host):\(url.port)"
        self.path = url.path
    }

    static func connect(_ client: BenchClient) -> EventLoopFuture<any Channel> {
        LongPollWire(client: client).open()
    }

    private func open() -> EventLoopFuture<any Channel> {
        connecting = true
        let url = client.target
        let bound = NIOLoopBound(self, eventLoop: client.loop)
        let future = ClientBootstrap.bench(group: client.loop, source: client.source)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHTTPClientHandlers()
                    try sync.addHandler(LongPollHandler(wire: bound.value))
                }
            }
            .connect(host: url.host, port: url.port)
        future.whenFailure { error in
            let wire = bound.value
            wire.connecting = false
            if wire.everConnected { wire.client.wireFailed("reconnect: \(error)") }
        }
        return future
    }

    // MARK: Events from the current connection

    func active(_ handler: LongPollHandler) {
        connecting = false
        self.handler = handler
        if closed {
            handler.close()
            return
        }
        if !everConnected {
            everConnected = true
            client.wireReady(self)  // sends the first request through `send`
        } else if let inFlight {
            handler.post(inFlight, wire: self)  // died unanswered on the previous connection
        } else {
            sendNext()
        }
    }

    func responseHead(_ head: HTTPResponseHead) {
        responseStarted = true
        status = head.status
        body = nil
    }

    func responseBody(_ chunk: ByteBuffer) {
        var chunk = chunk
        if body == nil { body = chunk } else { body!.writeBuffer(&chunk) }
    }

    func responseEnd() {
        inFlight = nil
        responseStarted = false
        resends = 0
        let response = body ?? ByteBuffer()
        body = nil
        if status == .ok {
            client.received(response)
        } else {
            client.wireFailed("HTTP \(status.code): \(String(buffer: response).prefix(120))")
        }
        client.readComplete()
        sendNext()
    }

    func inactive(_ handler: LongPollHandler) {
        guard handler === self.handler else { return }
        self.handler = nil
        guard !closed else { return }
        if let _ = inFlight {
            if responseStarted || resends >= 3 {
                inFlight = nil
                client.wireClosed()
                return
            }
            resends += 1
        }
        if inFlight != nil || !waiting.isEmpty { _ = open() }
    }

    func failed(_ error: any Error) {
        client.wireFailed("http: \(error)")
    }

    // MARK: BenchWire

    func send(_ body: ByteBuffer) {
        guard !closed else { return }
        waiting.append(body)
        sendNext()
    }

    private func sendNext() {
        guard inFlight == nil, !waiting.isEmpty else { return }
        if let handler {
            let next = waiting.removeFirst()
            inFlight = next
            handler.post(next, wire: self)
        } else if !connecting {
            _ = open()
        }
    }

    func close() {
        closed = true
        handler?.close()
    }
}

/// The pipeline end of one long-polling connection.
final class LongPollHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    private let wire: LongPollWire
    private var context: ChannelHandlerContext?

    init(wire: LongPollWire) { self.wire = wire }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func channelActive(context: ChannelHandlerContext) {
        wire.active(self)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): wire.responseHead(head)
        case .body(let chunk): wire.responseBody(chunk)
        case .end: wire.responseEnd()
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.context = nil
        wire.inactive(self)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        wire.failed(error)
        context.close(promise: nil)
    }

    func post(_ body: ByteBuffer, wire: LongPollWire) {
        guard let context else { return }
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: wire.hostHeader)
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: String(body.readableBytes))
        let head = HTTPRequestHead(version: .http1_1, method: .POST, uri: wire.path, headers: headers)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    func close() { context?.close(promise: nil) }
}
