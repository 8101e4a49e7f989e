import NIOCore
import NIOHTTP1
import PubSubCore

/// The EventSource transport's writes: the stream's head, its events as `data:` lines, heartbeats (comment lines)
/// and its end. When each goes is the connection machine's, as for every transport.
extension HTTPHandler {
    func openEventSource(_ clientId: String, version: HTTPVersion) {
        guard let context else { return }
        let head = HTTPResponseHead(version: version, status: .ok, headers: BayeuxHTTPResponse.streamHeaders)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(BayeuxHTTPResponse.streamStart))), promise: nil)
        driver.openStream(clientId: clientId)
    }

    func writeStream(_ events: CircularBuffer<WireEvent>, context: ChannelHandlerContext) {
        var bytes = 0
        for event in events { bytes += event.json.readableBytes + 10 }
        driver.counters.bytesOut &+= UInt64(bytes)
        for event in events {
            context.write(wrapOutboundOut(.body(.byteBuffer(BayeuxHTTPResponse.dataPrefix))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(event.json))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(BayeuxHTTPResponse.eventEnd))), promise: nil)
        }
        context.flush()
    }

    func sendHeartbeat() {
        driver.counters.bytesOut &+= UInt64(BayeuxHTTPResponse.heartbeat.readableBytes)
        context?.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(BayeuxHTTPResponse.heartbeat))), promise: nil)
    }

    /// The end of a stream.
    func close(_ reason: ConnectionStateMachine.CloseReason) {
        guard let context, driver.sendingClose() else { return }
        context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }
}
