import Crypto
import ExtrasBase64
import NIOCore
import NIOHTTP1
import NIOWebSocket

/// The WebSocket upgrade (RFC 6455 §4.2): checks `Sec-WebSocket-Key` and `Sec-WebSocket-Version: 13`, asks
/// `shouldUpgrade`, answers with `Sec-WebSocket-Accept`, and hands the channel to `upgradePipeline`, which adds
/// the one handler that frames and unframes itself (`WebSocketHandler`). NIO's `NIOWebSocketServerUpgrader`
/// adds a frame encoder, a decoder behind a `ByteToMessageHandler` and an error handler first: with an
/// aggregator, four handlers and their pipeline contexts kept by every idle WebSocket.
final class WebSocketUpgrader: HTTPServerProtocolUpgrader, Sendable {
    let supportedProtocol = "websocket"
    /// Checked here rather than required: clients need not list them in `Connection`.
    let requiredUpgradeHeaders: [String] = []

    private let shouldUpgrade: @Sendable (any Channel, HTTPRequestHead) -> Bool
    private let upgradePipeline: @Sendable (any Channel, HTTPRequestHead) throws -> Void
    /// Whether permessage-deflate is offered back to a client that asks for it (`PerMessageDeflate`).
    private let compression: Bool

    init(
        compression: Bool = false,
        shouldUpgrade: @escaping @Sendable (any Channel, HTTPRequestHead) -> Bool,
        upgradePipeline: @escaping @Sendable (any Channel, HTTPRequestHead) throws -> Void
    ) {
        self.compression = compression
        self.shouldUpgrade = shouldUpgrade
        self.upgradePipeline = upgradePipeline
    }

    func buildUpgradeResponse(
        channel: any Channel, upgradeRequest: HTTPRequestHead, initialResponseHeaders: HTTPHeaders
    )
        -> EventLoopFuture<HTTPHeaders>
    {
        let keys = upgradeRequest.headers["Sec-WebSocket-Key"]
        let versions = upgradeRequest.headers["Sec-WebSocket-Version"]
        // The key is 16 random bytes in base64 (RFC 6455 §4.1).
        guard keys.count == 1, versions.count == 1, versions[0] == "13",
            (try? keys[0].base64decoded())?.count == 16
        else {
            return channel.eventLoop.makeFailedFuture(NIOWebSocketUpgradeError.invalidUpgradeHeader)
        }
        guard shouldUpgrade(channel, upgradeRequest) else {
            // The request goes on to the HTTP handler, which answers it (a 404, a 403 for an origin).
            return channel.eventLoop.makeFailedFuture(NIOWebSocketUpgradeError.unsupportedWebSocketTarget)
        }
        var headers = HTTPHeaders()
        headers.add(name: "Upgrade", value: "websocket")
        headers.add(name: "Sec-WebSocket-Accept", value: Self.acceptValue(key: keys[0]))
        headers.add(name: "Connection", value: "upgrade")
        if compression, let extensions = PerMessageDeflate.negotiate(upgradeRequest.headers) {
            headers.add(name: "Sec-WebSocket-Extensions", value: extensions)
        }
        return channel.eventLoop.makeSucceededFuture(headers)
    }

    func upgrade(context: ChannelHandlerContext, upgradeRequest: HTTPRequestHead) -> EventLoopFuture<Void> {
        let channel = context.channel
        return channel.eventLoop.makeCompletedFuture { try self.upgradePipeline(channel, upgradeRequest) }
    }

    /// Base64 of the SHA-1 of the key and the protocol's GUID.
    static func acceptValue(key: String) -> String {
        let digest = Insecure.SHA1.hash(data: Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8))
        return Base64.encodeToString(bytes: Array(digest))
    }
}
