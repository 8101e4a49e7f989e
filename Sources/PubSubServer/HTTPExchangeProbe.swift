import NIOCore
import NIOHTTP1

/// Tells the `ConnectionGuard` in front when a request head and end are read and when a response has been sent.
/// Sits after the HTTP decoder and pipelining handler, before the upgrade handler; an upgrade removes it with
/// them.
///
/// A response counts as ended when the write of its end completes (its bytes are with the socket), not when it
/// is written: a long-poll reply of a few megabytes to a slow client is not idle while it goes out. The
/// pipelining handler hands the next request on as soon as a response's end is written, so the end of an older
/// response may complete while a newer request is in flight: only the end of the latest request is reported.
final class HTTPExchangeProbe: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// Request heads read so far.
    private var requests = 0
    /// Response ends written so far.
    private var responses = 0

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            requests += 1
            context.triggerUserOutboundEvent(ConnectionGuard.Event.requestHead, promise: nil)
        case .body:
            break
        case .end:
            context.triggerUserOutboundEvent(ConnectionGuard.Event.requestEnd, promise: nil)
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard case .end = unwrapOutboundIn(data) else {
            context.write(data, promise: promise)
            return
        }
        responses += 1
        let response = responses
        let sent = promise ?? context.eventLoop.makePromise()
        sent.futureResult.assumeIsolated().whenComplete { _ in
            guard response == self.requests else { return }
            context.triggerUserOutboundEvent(ConnectionGuard.Event.responseEnd, promise: nil)
        }
        context.write(data, promise: sent)
    }
}
