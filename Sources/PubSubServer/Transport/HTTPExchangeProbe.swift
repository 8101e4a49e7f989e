import NIOCore
import NIOHTTP1

/// Tells the `ConnectionGuard` in front when a request head and end are read and when a response's end is
/// written. Sits after the HTTP decoder and pipelining handler, before the upgrade handler; an upgrade removes
/// it with them. (A response written but still going out to a slow reader is the guard's business: at the idle
/// deadline it looks whether bytes are still unsent, and waits while they drain.)
final class HTTPExchangeProbe: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head: context.triggerUserOutboundEvent(ConnectionGuard.Event.requestHead, promise: nil)
        case .body: break
        case .end: context.triggerUserOutboundEvent(ConnectionGuard.Event.requestEnd, promise: nil)
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        // Before the write: the pipelining handler hands the next request on from inside it, and that
        // request's head must come after this response's end.
        if case .end = unwrapOutboundIn(data) {
            context.triggerUserOutboundEvent(ConnectionGuard.Event.responseEnd, promise: nil)
        }
        context.write(data, promise: promise)
    }
}
