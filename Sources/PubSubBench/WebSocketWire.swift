import NIOCore
import NIOHTTP1
import NIOPosix
import NIOWebSocket

/// A client WebSocket: NIO's client upgrader does the HTTP upgrade, then every text frame from the server is
/// handed to the client as it is, and every body the client sends goes out as one masked text frame.
final class WebSocketWire: ChannelInboundHandler, BenchWire, RemovableChannelHandler {
    typealias InboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    private let client: BenchClient
    private var context: ChannelHandlerContext?

    init(client: BenchClient) { self.client = client }

    static func connect(_ client: BenchClient) -> EventLoopFuture<any Channel> {
        let url = client.shared.options.url
        let loop = client.loop
        let bound = NIOLoopBound(client, eventLoop: loop)
        return ClientBootstrap(group: loop)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let upgrader = NIOWebSocketClientUpgrader(
                        maxFrameSize: 1 << 26,
                        automaticErrorHandling: true,
                        upgradePipelineHandler: { channel, _ in
                            channel.eventLoop.makeCompletedFuture {
                                let sync = channel.pipeline.syncOperations
                                try sync.addHandler(
                                    NIOWebSocketFrameAggregator(
                                        minNonFinalFragmentSize: 0, maxAccumulatedFrameCount: 1 << 16,
                                        maxAccumulatedFrameSize: 1 << 26))
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
        let frame = unwrapInboundIn(data)
        switch frame.opcode {
        case .text, .binary:
            client.received(frame.unmaskedData)
        case .ping:
            let pong = WebSocketFrame(fin: true, opcode: .pong, maskKey: .random(), data: frame.unmaskedData)
            context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
        case .connectionClose:
            client.wireClosed()
            context.close(promise: nil)
        default:
            break
        }
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
