import NIOCore
import NIOWebSocket

/// The WebSocket side of the keep-alive: first of the WebSocket handlers, it tells the `ConnectionGuard` that
/// the connection is a WebSocket now, and sends a ping when the guard says the socket has been silent for the
/// ping interval. The guard counts every byte received (a pong, a frame) as a sign of life and closes a socket
/// silent for two intervals. Frames pass through untouched.
final class WebSocketPingHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = WebSocketFrame
    typealias InboundOut = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    func handlerAdded(context: ChannelHandlerContext) {
        context.triggerUserOutboundEvent(ConnectionGuard.Event.upgraded, promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard event is ConnectionGuard.PingDue else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        let ping = WebSocketFrame(fin: true, opcode: .ping, data: context.channel.allocator.buffer(capacity: 0))
        context.writeAndFlush(wrapOutboundOut(ping), promise: nil)
    }
}
