import NIOCore
import NIOHTTP1

/// Tells the `ConnectionGuard` in front when a request head and end are read and when a response's end is
/// written. Sits after the HTTP decoder and pipelining handler, before the HTTP handler; an upgrade removes
/// it with them. (A response written but still going out to a slow reader is the guard's business: at the idle
/// deadline it looks whether bytes are still unsent, and waits while they drain.)
///
/// It also places the WebSocket upgrade: a request head that asks for an upgrade (on any request of a
/// keep-alive connection, not only the first: clients that pool connections, aiohttp for one, upgrade the
/// connection their handshake POST used) gets a fresh upgrade handler put right after this one before the head
/// is passed on. NIO's upgrade handler looks at one request and leaves; putting one back before every request
/// would add and remove a handler per long-poll.
///
/// And it answers a request the decoder cannot parse with `400 Bad Request` (unless a response is being
/// written), as NIO's `HTTPServerProtocolErrorHandler` does in its place: one handler less for every request
/// part and response part to pass.
final class HTTPExchangeProbe: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let makeUpgradeHandler: ((HTTPExchangeProbe) -> HTTPServerUpgradeHandler)?
    /// The guard in front, told directly: an outbound user event would pass every HTTP handler in between,
    /// three times per exchange. Without a guard the events go down the pipeline (and are dropped at its head).
    private var connectionGuard: ConnectionGuard?
    /// A response head has been written and its end not yet.
    private var hasUnterminatedResponse = false

    /// `makeUpgradeHandler`: the handler for a request that asks for an upgrade, given this probe (which the
    /// upgrade removes with the other HTTP handlers); nil where none is served.
    init(makeUpgradeHandler: ((HTTPExchangeProbe) -> HTTPServerUpgradeHandler)? = nil) {
        self.makeUpgradeHandler = makeUpgradeHandler
    }

    func handlerAdded(context: ChannelHandlerContext) {
        connectionGuard = try? context.pipeline.syncOperations.handler(type: ConnectionGuard.self)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        connectionGuard = nil
    }

    private func report(_ event: ConnectionGuard.Event, context: ChannelHandlerContext) {
        if let connectionGuard {
            connectionGuard.exchange(event)
        } else {
            context.triggerUserOutboundEvent(event, promise: nil)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            report(.requestHead, context: context)
            if let makeUpgradeHandler, head.headers.contains(name: "upgrade") {
                try? context.pipeline.syncOperations.addHandler(makeUpgradeHandler(self), position: .after(self))
            }
        case .body: break
        case .end: report(.requestEnd, context: context)
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head(let head):
            // A 1xx other than 101 is followed by the real head.
            let code = head.status.code
            if !(100..<200).contains(code) || code == 101 { hasUnterminatedResponse = true }
        case .body:
            break
        case .end:
            hasUnterminatedResponse = false
            // Before the write: the pipelining handler hands the next request on from inside it, and that
            // request's head must come after this response's end.
            report(.responseEnd, context: context)
        }
        context.write(data, promise: promise)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is HTTPParserError, !hasUnterminatedResponse {
            let headers = HTTPHeaders([("Connection", "close"), ("Content-Length", "0")])
            let head = HTTPResponseHead(version: .http1_1, status: .badRequest, headers: headers)
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }
        context.fireErrorCaught(error)
    }
}
