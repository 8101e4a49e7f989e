import Bayeux
import NIOCore
import NIOHTTP1
import NIOWebSocket
import PubSubCore

/// permessage-deflate on one WebSocket (`PerMessageDeflate`): a compressed message from the client is inflated,
/// within the message limit; events go out as the compressed frame their buffer carries (made once per publish),
/// written as they are. The connection keeps no compression state between messages: a negotiated socket costs
/// one flag in its parser.
extension WebSocketHandler {
    /// Whether this socket compresses: the server does (`BrokerConfiguration.eventCompression`) and the upgrade
    /// request offered what it can accept. The 101 response says so (`WebSocketUpgrader`) from the same request.
    static func compresses(_ upgradeHeaders: HTTPHeaders, _ configuration: ServerConfiguration) -> Bool {
        configuration.broker.eventCompression != nil && PerMessageDeflate.negotiate(upgradeHeaders) != nil
    }

    /// A data message's payload, inflated when it came compressed (RSV1); nil when it failed the connection.
    func payload(of frame: WebSocketFrame, context: ChannelHandlerContext) -> ByteBuffer? {
        guard frame.rsv1 else { return frame.data }
        do {
            return try PerMessageDeflate.inflate(frame.data, limit: shared.configuration.maxFrameBytes)
        } catch .tooLarge {
            frameError(.tooLarge, context: context)
        } catch {
            frameError(.corruptCompression, context: context)
        }
        return nil
    }

    /// With compression, the replies go in a frame of their own and each event in its own frame: its compressed
    /// frame, shared with every recipient, or its plain one. False (nothing written) when no event has a
    /// compressed frame: everything then goes in one plain frame, as without compression.
    func writeCompressed(replies: [Message], events: CircularBuffer<WireEvent>, context: ChannelHandlerContext) -> Bool
    {
        guard events.contains(where: { $0.compressed != nil }) else { return false }
        var bytes = 0
        if !replies.isEmpty {
            let payload = ReplyEncoder.encode(
                replies: replies, events: .noEvents, allocator: context.channel.allocator,
                headroom: WebSocketFrameHeader.maxLength)
            bytes += payload.readableBytes
            writeFrame(.text, payload, context: context)
        }
        for event in events {
            bytes += event.compressed?.readableBytes ?? event.json.readableBytes
            context.write(wrapOutboundOut(.byteBuffer(event.compressed ?? event.frame)), promise: nil)
        }
        context.flush()
        driver.counters.bytesOut &+= UInt64(bytes)
        return true
    }
}
