import Crypto
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

    init(
        shouldUpgrade: @escaping @Sendable (any Channel, HTTPRequestHead) -> Bool,
        upgradePipeline: @escaping @Sendable (any Channel, HTTPRequestHead) throws -> Void
    ) {
        self.shouldUpgrade = shouldUpgrade
        self.upgradePipeline = upgradePipeline
    }

    func buildUpgradeResponse(channel: any Channel, upgradeRequest: HTTPRequestHead, initialResponseHeaders: HTTPHeaders)
        -> EventLoopFuture<HTTPHeaders>
    {
        let keys = upgradeRequest.headers["Sec-WebSocket-Key"]
        let versions = upgradeRequest.headers["Sec-WebSocket-Version"]
        guard keys.count == 1, versions.count == 1, versions[0] == "13" else {
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
        return channel.eventLoop.makeSucceededFuture(headers)
    }

    func upgrade(context: ChannelHandlerContext, upgradeRequest: HTTPRequestHead) -> EventLoopFuture<Void> {
        let channel = context.channel
        return channel.eventLoop.makeCompletedFuture { try self.upgradePipeline(channel, upgradeRequest) }
    }

    /// Base64 of the SHA-1 of the key and the protocol's GUID.
    static func acceptValue(key: String) -> String {
        let digest = Insecure.SHA1.hash(data: Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8))
        return base64(Array(digest))
    }

    private static func base64(_ bytes: [UInt8]) -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i < bytes.count {
            let b0 = bytes[i]
            let b1 = i + 1 < bytes.count ? bytes[i + 1] : 0
            let b2 = i + 2 < bytes.count ? bytes[i + 2] : 0
            out.append(alphabet[Int(b0 >> 2)])
            out.append(alphabet[Int((b0 & 0x03) << 4 | b1 >> 4)])
            out.append(i + 1 < bytes.count ? alphabet[Int((b1 & 0x0F) << 2 | b2 >> 6)] : UInt8(ascii: "="))
            out.append(i + 2 < bytes.count ? alphabet[Int(b2 & 0x3F)] : UInt8(ascii: "="))
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }
}
