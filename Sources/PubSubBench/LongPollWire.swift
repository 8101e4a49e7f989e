import NIOCore
import NIOPosix

/// Bayeux long-polling over HTTP/1.1: each body is POSTed as `application/json`, one request outstanding at a
/// time (bodies sent meanwhile wait their turn, in order), each response body handed to the client whole.
///
/// The connection carries bytes only: a request is its fixed head (written once per wire) and the body in one
/// buffer, and responses are cut out by `HTTPResponseFramer`, so a poll costs one write, one read and a scan.
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
    /// Requests (head and body) not sent yet.
    private var waiting = CircularBuffer<ByteBuffer>()
    /// The request in flight, kept until its response arrives.
    private var inFlight: ByteBuffer?
    private var resends = 0
    /// `POST … Content-Length: ` up to the length, the same for every request of this wire.
    private let headPrefix: [UInt8]
    /// The last request built, cleared and refilled for the next: its storage is reused once the previous
    /// request has been written and answered, else `clear()` gives it new storage and the old one stays with
    /// whoever holds it.
    private var request = ByteBuffer()

    private init(client: BenchClient) {
        self.client = client
        let url = client.target
        let host = url.host.contains(":") ? "[\(url.host)]" : url.host
        self.headPrefix = Array(
            "POST \(url.path) HTTP/1.1\r\nHost: \(host):\(url.port)\r\nContent-Type: application/json\r\nContent-Length: "
                .utf8)
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
            handler.write(inFlight)  // died unanswered on the previous connection
        } else {
            sendNext()
        }
    }

    /// A complete response on the current connection.
    func response(_ response: HTTPResponseFramer.Response, from handler: LongPollHandler) {
        guard handler === self.handler else { return }
        inFlight = nil
        resends = 0
        if !response.keepAlive {
            // The server closes after this response: the next request goes on a new connection.
            self.handler = nil
            handler.close()
        }
        if response.status == 200 {
            client.received(response.body)
        } else {
            client.wireFailed("HTTP \(response.status): \(String(buffer: response.body).prefix(120))")
        }
        client.readComplete()
        sendNext()
    }

    /// The connection ended; `midResponse` when part of a response had arrived on it.
    func inactive(_ handler: LongPollHandler, midResponse: Bool) {
        guard handler === self.handler else { return }
        self.handler = nil
        guard !closed else { return }
        if inFlight != nil {
            if midResponse || resends >= 3 {
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
        startRequest(bodyLength: body.readableBytes)
        var body = body
        request.writeBuffer(&body)
        enqueue(request)
    }

    /// A `/meta/connect`: the body is `prefix`, the id and `"}]`, written straight after the head.
    func send(prefix: [UInt8], id: Int) {
        guard !closed else { return }
        startRequest(bodyLength: prefix.count + decimalDigits(id) + 3)
        request.writeBytes(prefix)
        request.writeDecimal(id)
        request.writeStaticString("\"}]")
        enqueue(request)
    }

    /// Clears `request` and writes the head of a request whose body has `bodyLength` bytes.
    private func startRequest(bodyLength: Int) {
        request.clear()
        request.reserveCapacity(headPrefix.count + 24 + bodyLength)
        request.writeBytes(headPrefix)
        request.writeDecimal(bodyLength)
        request.writeStaticString("\r\n\r\n")
    }

    private func enqueue(_ request: ByteBuffer) {
        if inFlight == nil, waiting.isEmpty, let handler {
            inFlight = request  // the usual case, a poll after a reply: straight out
            handler.write(request)
            return
        }
        waiting.append(request)
        sendNext()
    }

    private func sendNext() {
        guard inFlight == nil, !waiting.isEmpty else { return }
        if let handler {
            let next = waiting.removeFirst()
            inFlight = next
            handler.write(next)
        } else if !connecting {
            _ = open()
        }
    }

    func close() {
        closed = true
        handler?.close()
    }
}

/// The only handler of a long-polling connection: bytes in go through the framer, requests out are bytes.
final class LongPollHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let wire: LongPollWire
    private var context: ChannelHandlerContext?
    private var framer = HTTPResponseFramer()

    init(wire: LongPollWire) { self.wire = wire }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func channelActive(context: ChannelHandlerContext) {
        wire.active(self)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        framer.feed(unwrapInboundIn(data))
        do {
            while let response = try framer.next() { wire.response(response, from: self) }
        } catch {
            wire.failed(error)
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.context = nil
        do {
            if let response = try framer.end() { wire.response(response, from: self) }
        } catch {
            wire.failed(error)
        }
        wire.inactive(self, midResponse: framer.isMidResponse)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        wire.failed(error)
        context.close(promise: nil)
    }

    func write(_ request: ByteBuffer) {
        context?.writeAndFlush(wrapOutboundOut(request), promise: nil)
    }

    func close() { context?.close(promise: nil) }
}

/// The number of decimal digits of a non-negative integer.
func decimalDigits(_ value: Int) -> Int {
    var n = value
    var count = 1
    while n >= 10 {
        n /= 10
        count += 1
    }
    return count
}

extension ByteBuffer {
    /// Writes a non-negative integer in decimal, without building a string.
    mutating func writeDecimal(_ value: Int) {
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // room for 24 digits, written backwards
        var n = UInt(max(0, value))
        var count = 0
        withUnsafeMutableBytes(of: &digits) { out in
            repeat {
                out[23 - count] = UInt8(truncatingIfNeeded: 0x30 + n % 10)
                n /= 10
                count += 1
            } while n > 0
            _ = writeBytes(UnsafeRawBufferPointer(rebasing: out[(24 - count)...]))
        }
    }
}
