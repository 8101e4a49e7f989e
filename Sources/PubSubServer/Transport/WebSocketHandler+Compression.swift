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
    func payload(of frame: WebSocketFrameParser.Frame, context: ChannelHandlerContext) -> ByteBuffer? {
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

    /// Frames up to this size are copied into one buffer with the frames around them, so that events that go out
    /// together are one write; a larger one is written as it is, shared with every recipient.
    static let coalescedFrameLimit = 2048

    /// At most this many bytes of event frames are copied for one write; the frames past it are written as they
    /// are, shared. A recipient handed a long backlog at once then holds its own copy of 16 KiB of it, not of all
    /// of it: what a broadcast to many slow readers keeps stays the shared frames.
    static let coalescedBytesLimit = 16 * 1024

    /// With compression, the replies go in a frame of their own and each event in its own frame: its compressed
    /// frame, shared with every recipient, or its plain one. False (nothing written) when no event has a
    /// compressed frame: everything then goes in one plain frame, as without compression.
    ///
    /// A lone event is written as the frame it carries. Otherwise the frames are one buffer (the replies' frame,
    /// built here, then a copy of each small event frame, up to `coalescedBytesLimit`): one write, and no pending
    /// write per event, instead of a pending write for each shared frame. A large frame, or one past the limit,
    /// goes as it is, between the buffers around it.
    func writeCompressed(replies: [Message], events: CircularBuffer<WireEvent>, context: ChannelHandlerContext) -> Bool
    {
        guard events.contains(where: { $0.compressed != nil }) else { return false }
        if replies.isEmpty, events.count == 1, let only = events.first {
            driver.counters.bytesOut &+= UInt64(only.compressed?.readableBytes ?? only.json.readableBytes)
            context.writeAndFlush(wrapOutboundOut(.byteBuffer(only.compressed ?? only.frame)), promise: nil)
            return true
        }
        let limit = Self.coalescedFrameLimit
        let budget = Self.coalescedBytesLimit
        var small = 0
        for event in events {
            let size = (event.compressed ?? event.frame).readableBytes
            if size <= limit, small + size <= budget { small += size }
        }
        var bytes = 0
        var pending: ByteBuffer
        if replies.isEmpty {
            pending = context.channel.allocator.buffer(capacity: small)
        } else {
            var payload = ReplyEncoder.encode(
                replies: replies, events: .noEvents, allocator: context.channel.allocator,
                headroom: WebSocketFrameHeader.maxLength)
            bytes += payload.readableBytes
            if WebSocketFrameHeader.prepend(opcode: .text, to: &payload) {
                pending = consume payload
            } else {
                pending = WebSocketFrameHeader.buffer(
                    opcode: .text, payloadLength: payload.readableBytes, allocator: context.channel.allocator)
                pending.writeBuffer(&payload)
            }
            pending.reserveCapacity(minimumWritableBytes: small)
        }
        var copied = 0
        for event in events {
            let frame = event.compressed ?? event.frame
            bytes += event.compressed?.readableBytes ?? event.json.readableBytes
            if frame.readableBytes <= limit, copied + frame.readableBytes <= budget {
                pending.writeImmutableBuffer(frame)
                copied += frame.readableBytes
                continue
            }
            if pending.readableBytes > 0 {
                context.write(wrapOutboundOut(.byteBuffer(pending)), promise: nil)
                pending = context.channel.allocator.buffer(capacity: max(0, small - copied))
            }
            context.write(wrapOutboundOut(.byteBuffer(frame)), promise: nil)
        }
        if pending.readableBytes > 0 { context.write(wrapOutboundOut(.byteBuffer(pending)), promise: nil) }
        context.flush()
        driver.counters.bytesOut &+= UInt64(bytes)
        return true
    }
}
