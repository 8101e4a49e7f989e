import NIOCore
import NIOHTTP1
import NIOPosix
import NIOWebSocket

/// A client WebSocket: NIO's client upgrader does the HTTP upgrade and NIO's encoder masks what the client sends
/// (one text frame per body). Incoming frames are read here, straight from the socket's bytes: a server's
/// frames are unmasked and nearly always whole, so the payload of each text frame is handed to the client as a
/// slice of the read buffer, without the generic decoder and aggregator (the load generator reads far more
/// frames than it writes, and must not be the bottleneck). Fragmented messages are reassembled.
final class WebSocketWire: ChannelInboundHandler, BenchWire, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = WebSocketFrame

    private let client: BenchClient
    private var context: ChannelHandlerContext?
    /// Bytes of an incomplete frame.
    private var partial: ByteBuffer?
    /// The text of a fragmented message so far.
    private var fragments: ByteBuffer?
    private var closing = false
    private static let maxMessage = 1 << 26

    init(client: BenchClient) { self.client = client }

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
                        upgradePipelineHandler: { channel, _ in
                            channel.eventLoop.makeCompletedFuture {
                                let sync = channel.pipeline.syncOperations
                                let decoder = try sync.handler(type: ByteToMessageHandler<WebSocketFrameDecoder>.self)
                                sync.removeHandler(decoder, promise: nil)
                                try sync.addHandler(WebSocketWire(client: bound.value))
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
                let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: url.path, headers: headers)
                channel.write(HTTPClientRequestPart.head(head), promise: nil)
                return channel.writeAndFlush(HTTPClientRequestPart.end(nil)).map { channel }
            }
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if let watcher = try? context.pipeline.syncOperations.handler(type: UpgradeWatcher.self) {
            context.pipeline.syncOperations.removeHandler(watcher, promise: nil)
        }
        client.wireReady(self)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !closing else { return }
        var bytes = unwrapInboundIn(data)
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
        var opcode: UInt8
        var length: Int
        var payload: ByteBuffer
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
        return Frame(fin: b0 & 0x80 != 0, opcode: b0 & 0x0F, length: length, payload: payload)
    }

    private func handle(_ frame: Frame, context: ChannelHandlerContext) {
        switch frame.opcode {
        case 0x1, 0x2:
            if frame.fin {
                client.received(frame.payload)
            } else {
                fragments = frame.payload
            }
        case 0x0:
            guard var text = fragments else {
                protocolError("continuation without a first fragment", context: context)
                return
            }
            var more = frame.payload
            text.writeBuffer(&more)
            if text.readableBytes > Self.maxMessage {
                protocolError("message too large", context: context)
                return
            }
            if frame.fin {
                fragments = nil
                client.received(text)
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
