import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOTLS

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One HTTP response, whole.
struct HTTPResponse: Sendable {
    var status: Int
    var headers: HTTPHeaders
    var body: ByteBuffer
}

/// A request and where its response goes; handed to the channel as one outbound item.
struct HTTPRequest: Sendable {
    var head: HTTPRequestHead
    var body: ByteBuffer
    var promise: EventLoopPromise<HTTPResponse>
}

/// One keep-alive HTTP/1.1 connection. Requests may be pipelined: each is written as soon as it is enqueued,
/// and responses complete their requests in order.
final class HTTPConnection: Sendable {
    let channel: any Channel
    let url: BayeuxURL

    private init(channel: any Channel, url: BayeuxURL) {
        self.channel = channel
        self.url = url
    }

    static func open(_ url: BayeuxURL, group: any EventLoopGroup, connectTimeout: TimeAmount, tls: NIOSSLContext?)
        async throws -> HTTPConnection
    {
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(connectTimeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(
                            NIOSSLClientHandler(context: tls, serverHostname: url.tlsServerName))
                        try channel.pipeline.syncOperations.addHandler(TLSHandshakeWaiter(channel.eventLoop))
                    }
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(HTTPResponseCollector())
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: url.host, port: url.port).get()
        } catch {
            throw BayeuxClientError(.unreachable, "cannot connect to \(url.hostHeader): \(describe(error))")
        }
        if tls != nil {
            try await TLSHandshakeWaiter.wait(on: channel, url: url, timeout: connectTimeout)
        }
        return HTTPConnection(channel: channel, url: url)
    }

    var isActive: Bool { channel.isActive }

    /// Writes a POST of `body` now (so calls made in sequence are sent in sequence) and returns its response.
    /// After `timeout` the request fails and the connection is closed (failing the requests behind it).
    func post(_ body: ByteBuffer, contentType: String = "application/json", timeout: TimeAmount)
        -> EventLoopFuture<HTTPResponse>
    {
        request(.POST, uri: url.path, headers: [:], body: body, contentType: contentType, timeout: timeout)
    }

    /// Writes any request now and returns its response, with the same timeout and failures as `post`.
    func request(
        _ method: HTTPMethod, uri: String, headers extra: HTTPHeaders, body: ByteBuffer?,
        contentType: String = "application/json", timeout: TimeAmount
    ) -> EventLoopFuture<HTTPResponse> {
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: url.hostHeader)
        if body != nil { headers.add(name: "Content-Type", value: contentType) }
        headers.add(name: "Content-Length", value: String(body?.readableBytes ?? 0))
        headers.add(name: "Accept", value: "application/json")
        headers.add(name: "User-Agent", value: "pubsub-client")
        headers.add(contentsOf: extra)
        let head = HTTPRequestHead(version: .http1_1, method: method, uri: uri, headers: headers)
        let channel = self.channel
        let promise = channel.eventLoop.makePromise(of: HTTPResponse.self)
        let timer = channel.eventLoop.scheduleTask(in: timeout) {
            promise.fail(
                BayeuxClientError(.timeout, "no answer from \(self.url.hostHeader) within \(seconds(timeout))"))
            channel.close(promise: nil)
        }
        promise.futureResult.whenComplete { _ in timer.cancel() }
        channel.writeAndFlush(HTTPRequest(head: head, body: body ?? ByteBuffer(), promise: promise)).whenFailure {
            error in
            promise.fail(
                BayeuxClientError(.connectionClosed, "connection to \(self.url.hostHeader) lost: \(describe(error))"))
        }
        return promise.futureResult
    }

    func close() {
        channel.close(promise: nil)
    }
}

/// Turns pipelined requests into whole responses, first in first out.
final class HTTPResponseCollector: ChannelDuplexHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = HTTPRequest
    typealias OutboundOut = HTTPClientRequestPart

    private var waiting = CircularBuffer<EventLoopPromise<HTTPResponse>>()
    private var head: HTTPResponseHead?
    private var body = ByteBuffer()

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let request = unwrapOutboundIn(data)
        waiting.append(request.promise)
        context.write(wrapOutboundOut(.head(request.head)), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(request.body))), promise: nil)
        context.write(wrapOutboundOut(.end(nil)), promise: promise)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let h):
            head = h
            body.clear()
        case .body(var chunk):
            body.writeBuffer(&chunk)
        case .end:
            guard let head else { return }
            self.head = nil
            if head.status.code < 200 { return }  // 1xx: the real response follows
            let response = HTTPResponse(status: Int(head.status.code), headers: head.headers, body: body)
            body = ByteBuffer()
            if let promise = waiting.popFirst() { promise.succeed(response) }
            if !head.isKeepAlive { context.close(promise: nil) }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        failAll(BayeuxClientError(.connectionClosed, "the server closed the connection before answering"))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is NIOSSLError || error is NIOSSLExtraError || error is BoringSSLError {
            // The server is there but cannot be trusted (or speaks no TLS): as good as unreachable.
            failAll(
                BayeuxClientError(
                    .unreachable,
                    "TLS with \(context.channel.remoteAddress?.description ?? "the server") failed: \(describe(error))")
            )
        } else {
            failAll(BayeuxClientError(.connectionClosed, "connection failed: \(describe(error))"))
        }
        context.close(promise: nil)
    }

    private func failAll(_ error: BayeuxClientError) {
        while let promise = waiting.popFirst() { promise.fail(error) }
    }
}

func seconds(_ amount: TimeAmount) -> String {
    let s = Double(amount.nanoseconds) / 1e9
    return s == s.rounded() ? "\(Int(s)) s" : "\(s) s"
}

/// A short, human description of a NIO or system error.
func describe(_ error: any Error) -> String {
    if let e = error as? BayeuxClientError { return e.message }
    if let e = error as? NIOConnectionError {
        if let first = e.connectionErrors.first { return describe(first.error) }
        if e.dnsAError != nil || e.dnsAAAAError != nil { return "cannot resolve host" }
    }
    if let e = error as? IOError {
        switch e.errnoCode {
        case ECONNREFUSED: return "connection refused"
        case ETIMEDOUT: return "connection timed out"
        case EHOSTUNREACH, ENETUNREACH: return "no route to host"
        case ECONNRESET: return "connection reset"
        default: return "\(e)"
        }
    }
    if error is ChannelError {
        if case ChannelError.connectTimeout(let t) = error { return "connect timed out after \(seconds(t))" }
        return "\(error)"
    }
    return "\(error)"
}

/// Completes when the TLS handshake of a new connection is done, so that a certificate that cannot be trusted is
/// reported as such (`unreachable`) before any request is written, never as a lost request.
final class TLSHandshakeWaiter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny
    let done: EventLoopPromise<Void>

    init(_ loop: any EventLoop) { done = loop.makePromise() }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case TLSUserEvent.handshakeCompleted = event { done.succeed(()) }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        done.fail(error)
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        done.fail(ChannelError.ioOnClosedChannel)
        context.fireChannelInactive()
    }

    /// Waits for the handshake of `channel` (which has a waiter); closes it and throws `unreachable` on failure.
    static func wait(on channel: any Channel, url: BayeuxURL, timeout: TimeAmount) async throws {
        let future = channel.eventLoop.flatSubmit {
            do {
                return try channel.pipeline.syncOperations.handler(type: TLSHandshakeWaiter.self).done.futureResult
            } catch {
                return channel.eventLoop.makeFailedFuture(error)
            }
        }
        let timer = channel.eventLoop.scheduleTask(in: timeout) { channel.close(promise: nil) }
        defer { timer.cancel() }
        do {
            try await future.get()
        } catch {
            channel.close(promise: nil)
            throw BayeuxClientError(.unreachable, "TLS with \(url.hostHeader) failed: \(describe(error))")
        }
    }
}
