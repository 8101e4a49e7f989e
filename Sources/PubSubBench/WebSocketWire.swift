import NIOCore
import NIOHTTP1
import NIOPosix
import NIOWebSocket

/// A client WebSocket: NIO's client upgrader does the HTTP upgrade and NIO's encoder masks what the client sends
/// (one text frame per body). Incoming frames are read here, straight from the socket's bytes: a server's
/// frames are unmasked and nearly always whole, so the payload of each text frame is handed to the client as a
/// slice of the read buffer, without the generic decoder and aggregator (the load generator reads far more
/// frames than it writes, and must not be the bottleneck). Fragmented messages are reassembled.
///
/// With `--compression` the upgrade request offers permessage-deflate (`PerMessageDeflate`); when the server
/// accepts, a message whose first frame has RSV1 set is inflated before the client reads it. A subscriber counts
/// every byte its socket hands over (`LoopStats.wireRead`) and samples what its event frames would take plain and
/// compressed by zlib alone.
final class WebSocketWire: ChannelInboundHandler, BenchWire, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = WebSocketFrame

    private let client: BenchClient
    private var context: ChannelHandlerContext?
    /// Bytes of an incomplete frame.
    private var partial: ByteBuffer?
    /// The text of a fragmented message so far.
    private var fragments: ByteBuffer?
    /// Whether the fragmented message being reassembled came compressed (RSV1 on its first frame).
    private var fragmentsCompressed = false
    /// Bytes on the wire of the fragmented message so far (headers included).
    private var fragmentsWireBytes = 0
    private var closing = false
    /// The server accepted permessage-deflate in its 101 response.
    private let compressed: Bool
    /// A subscriber's socket: its bytes are counted and its event frames sampled.
    private let counts: Bool
    private static let maxMessage = 1 << 26

    init(client: BenchClient, compressed: Bool) {
        self.client = client
        self.compressed = compressed
        self.counts = client.isSubscriber
    }

    static func connect(_ client: BenchClient) -> EventLoopFuture<any Channel> {
        let url = client.target
        let loop = client.loop
        let bound = NIOLoopBound(client, eventLoop: loop)
        return ClientBootstrap.bench(group: loop, source: client.source)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let upgrader = NIOWebSocketClientUpgrader(
                        maxFrameSize: 1 << 26,
                        automaticErrorHandling: false,
                        upgradePipelineHandler: { channel, response in
                            channel.eventLoop.makeCompletedFuture {
                                let sync = channel.pipeline.syncOperations
                                let decoder = try sync.handler(type: ByteToMessageHandler<WebSocketFrameDecoder>.self)
                                sync.removeHandler(decoder, promise: nil)
                                let negotiated = PerMessageDeflate.negotiated(response.headers)
                                try sync.addHandler(WebSocketWire(client: bound.value, compressed: negotiated))
                            }
                        })
                    let sync = channel.pipeline.syncOperations
                    try sync.addHTTPClientHandlers(
                        leftOverBytesStrategy: .forwardBytes,
                        withClientUpgrade: (upgraders: [upgrader], completionHandler: { _ in }))
                    try sync.addHandler(UpgradeWatcher(client: bound.value))
                }
            }
            .connect(host: url.host, port: url.port)
            .flatMap { channel in
                var headers = HTTPHeaders()
                headers.add(name: "Host", value: "\(url.host):\(url.port)")
                headers.add(name: "Content-Length", value: "0")
                if client.shared.options.compression {
                    headers.add(name: "Sec-WebSocket-Extensions", value: PerMessageDeflate.offer)
                }
                let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: url.path, headers: headers)
                channel.write(HTTPClientRequestPart.head(head), promise: nil)
                return channel.writeAndFlush(HTTPClientRequestPart.end(nil)).map { channel }
            }
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if compressed { client.stats.compressionNegotiated += 1 }
        if let watcher = try? context.pipeline.syncOperations.handler(type: UpgradeWatcher.self) {
            context.pipeline.syncOperations.removeHandler(watcher, promise: nil)
        }
        client.wireReady(self)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !closing else { return }
        var bytes = unwrapInboundIn(data)
        if counts { client.stats.wireRead(bytes.readableBytes, now: monotonicNanoseconds()) }
        if var held = partial {
            partial = nil
            held.writeBuffer(&bytes)
            bytes = held
        }
        while let frame = Self.nextFrame(&bytes) {
            guard frame.length <= Self.maxMessage else {
                protocolError("frame of \(frame.length) bytes", context: context)
                return
            }
            handle(frame, context: context)
            if closing { return }
        }
        if bytes.readableBytes > 0 {
            if bytes.readableBytes > Self.maxMessage + 14 {
                protocolError("frame too large", context: context)
                return
            }
            bytes.discardReadBytes()
            partial = bytes
        }
    }

    struct Frame {
        var fin: Bool
        /// RSV1: on a data message's first frame, the message is compressed (permessage-deflate).
        var rsv1: Bool = false
        var opcode: UInt8
        var length: Int
        var payload: ByteBuffer
        /// Header and payload, as on the wire.
        var wireBytes: Int = 0
    }

    /// Takes one whole frame off the front of `bytes`, or nil when it is not all there yet.
    static func nextFrame(_ bytes: inout ByteBuffer) -> Frame? {
        let start = bytes.readerIndex
        guard let b0: UInt8 = bytes.getInteger(at: start), let b1: UInt8 = bytes.getInteger(at: start + 1) else {
            return nil
        }
        var header = 2
        var length = Int(b1 & 0x7F)
        if length == 126 {
            guard let l: UInt16 = bytes.getInteger(at: start + 2) else { return nil }
            length = Int(l)
            header = 4
        } else if length == 127 {
            guard let l: UInt64 = bytes.getInteger(at: start + 2) else { return nil }
            length = l > UInt64(Int32.max) ? Int(Int32.max) : Int(l)
            header = 10
        }
        let masked = b1 & 0x80 != 0
        var key: WebSocketMaskingKey?
        if masked {
            guard let k = bytes.getBytes(at: start + header, length: 4) else { return nil }
            key = WebSocketMaskingKey(k)
            header += 4
        }
        if length > maxMessage { return Frame(fin: true, opcode: b0 & 0x0F, length: length, payload: ByteBuffer()) }
        guard bytes.readableBytes >= header + length,
            var payload = bytes.getSlice(at: start + header, length: length)
        else { return nil }
        bytes.moveReaderIndex(forwardBy: header + length)
        if let key { payload.webSocketUnmask(key) }
        return Frame(
            fin: b0 & 0x80 != 0, rsv1: b0 & 0x40 != 0, opcode: b0 & 0x0F, length: length, payload: payload,
            wireBytes: header + length)
    }

    private func handle(_ frame: Frame, context: ChannelHandlerContext) {
        switch frame.opcode {
        case 0x1, 0x2:
            if frame.rsv1, !compressed {
                protocolError("RSV1 set without permessage-deflate", context: context)
                return
            }
            if frame.fin {
                message(frame.payload, compressed: frame.rsv1, wireBytes: frame.wireBytes, context: context)
            } else {
                fragments = frame.payload
                fragmentsCompressed = frame.rsv1
                fragmentsWireBytes = frame.wireBytes
            }
        case 0x0:
            guard var text = fragments else {
                protocolError("continuation without a first fragment", context: context)
                return
            }
            var more = frame.payload
            text.writeBuffer(&more)
            fragmentsWireBytes += frame.wireBytes
            if text.readableBytes > Self.maxMessage {
                protocolError("message too large", context: context)
                return
            }
            if frame.fin {
                fragments = nil
                message(text, compressed: fragmentsCompressed, wireBytes: fragmentsWireBytes, context: context)
            } else {
                fragments = text
            }
        case 0x8:
            closing = true
            client.wireClosed()
            context.close(promise: nil)
        case 0x9:
            let pong = WebSocketFrame(fin: true, opcode: .pong, maskKey: .random(), data: frame.payload)
            context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
        default:
            break
        }
    }

    /// A whole data message: inflated when it came compressed, sampled (subscribers), then read by the client.
    private func message(_ payload: ByteBuffer, compressed: Bool, wireBytes: Int, context: ChannelHandlerContext) {
        var text = payload
        let stats = client.stats
        if compressed {
            guard let inflated = stats.compression.inflate(payload, limit: Self.maxMessage) else {
                protocolError("a compressed message that does not inflate", context: context)
                return
            }
            text = inflated
        }
        if counts, stats.sample.frames < LoopStats.compressionSampleLimit {
            // One message in 37 (a prime: with N subscribers on a channel the sample spreads over many publishes).
            stats.messagesSeen &+= 1
            if stats.messagesSeen % 37 == 1 { sample(text, wireBytes: wireBytes, stats: stats) }
        }
        client.received(text)
    }

    /// Adds a frame that carried events to the loop's sample: its bytes on the wire, and what the same message
    /// takes as a plain frame and compressed by zlib alone.
    private func sample(_ text: ByteBuffer, wireBytes: Int, stats: LoopStats) {
        var events = 0
        _ = text.withUnsafeReadableBytes { bytes in
            ReplyScanner.scan(bytes) { item in
                if case .event = item { events += 1 }
            }
        }
        guard events > 0, let zlib = stats.compression.zlibAloneFrameBytes(text) else { return }
        stats.sample.add(
            CompressionSample(
                frames: 1, events: events, wireBytes: wireBytes,
                plainBytes: PerMessageDeflate.headerLength(ofPayload: text.readableBytes) + text.readableBytes,
                zlibBytes: zlib))
    }

    private func protocolError(_ reason: String, context: ChannelHandlerContext) {
        client.wireFailed("websocket: \(reason)")
        closing = true
        partial = nil
        fragments = nil
        context.close(promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        client.readComplete()
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        client.wireClosed()
        self.context = nil
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        client.wireFailed("websocket: \(error)")
        context.close(promise: nil)
    }

    func send(_ body: ByteBuffer) {
        guard let context else { return }
        let frame = WebSocketFrame(fin: true, opcode: .text, maskKey: .random(), data: body)
        context.writeAndFlush(wrapOutboundOut(frame), promise: nil)
    }

    func close() {
        context?.close(promise: nil)
    }
}

/// Reports a refused or failed upgrade to the client; removed once the upgrade succeeded.
final class UpgradeWatcher: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart

    private let client: BenchClient

    init(client: BenchClient) { self.client = client }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(let head) = unwrapInboundIn(data) {
            client.wireFailed("websocket upgrade refused: HTTP \(head.status.code)")
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        client.wireFailed("websocket upgrade: \(error)")
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        client.wireFailed("connection closed during the websocket upgrade")
        context.fireChannelInactive()
    }
}
