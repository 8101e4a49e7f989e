import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import NIOWebSocket
import PubSubCore

/// Bayeux over one WebSocket. Each text frame holds one message or an array; the replies to a frame go out as
/// one frame, at once, except a held `/meta/connect`, whose reply follows when its hold ends or a newer connect
/// supersedes it. Events are pushed as they arrive: everything pending for the socket in one frame (with
/// compression, each event in the frame compressed once per publish: `WebSocketHandler+Compression`). A binary
/// frame is read as UTF-8 JSON like a text frame (as Faye's Node server does; iOS and Java clients send them).
/// What to send when is the `ConnectionStateMachine`'s, performed by the connection's `ConnectionDriver`: this
/// handler decodes frames, hands their messages to the driver, and writes and closes as it says. While the socket
/// is not writable (`maxOutboundBytes` waiting) it is not read, and delivered events wait in the machine, up to
/// `maxQueue`, past which the client is dropped. It reads and writes the socket's bytes itself (`WebSocketFrameParser`, `WebSocketFrameHeader`): one handler
/// where NIO's frame encoder, decoder, aggregator and error handler were four, each with its pipeline context.
final class WebSocketHandler: ChannelDuplexHandler, ConnectionTransport {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = IOData
    typealias OutboundOut = IOData

    let shared: ServerShared
    private var context: ChannelHandlerContext?
    /// Performs what the connection's `ConnectionStateMachine` decides; set when this handler joins the pipeline.
    private(set) var driver: ConnectionDriver!
    /// Inside `parseFrames` (a frame handled at once finishes within it: the loop goes on by itself).
    private var parsing = false
    private var parser: WebSocketFrameParser
    /// Who this socket's publishes are counted against, when publish limits are set (from the upgrade request).
    private let publishLimitKeys: PublishLimitKeys?

    /// `eventLoop`: the channel's; the driver, made here, keeps the request context of the upgrade for every frame.
    init(shared: ServerShared, remoteAddress: String?, upgradeHeaders: HTTPHeaders = [:], eventLoop: any EventLoop) {
        self.shared = shared
        let maxFrame = shared.configuration.maxFrameBytes
        self.parser = WebSocketFrameParser(
            maxFrameSize: maxFrame, maxMessageSize: maxFrame, maxFragments: 4096,
            compressed: Self.compresses(upgradeHeaders, shared.configuration))
        let operations = shared.operations
        publishLimitKeys = operations.limiter.map { _ in
            PublishLimitKeys(
                upgradeHeaders, remoteAddress: remoteAddress,
                trustForwardedFor: operations.configuration.trustForwardedFor)
        }
        let headers = RequestContext.authorizationHeaders(upgradeHeaders)
        let context = RequestContext(connectionType: .websocket, remoteAddress: remoteAddress, headers: headers)
        driver = ConnectionDriver(transport: self, context: context, shared: shared, eventLoop: eventLoop)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        driver.opened()
        if !context.channel.isWritable { driver.writabilityChanged(isWritable: false) }
        // The WebSocket is timed by its driver from now on (pings, silence, blocked writes): the guard hands over
        // and leaves.
        let sync = context.pipeline.syncOperations
        if let connectionGuard = try? sync.handler(type: ConnectionGuard.self) {
            driver.keepAlive(connectionGuard.handOver())
            sync.removeHandler(connectionGuard, promise: nil)
        }
    }

    /// The server is draining: answer a held connect, send what is waiting, close with 1001.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard event is ChannelShouldQuiesceEvent else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        driver.quiesce()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        driver.closed()
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        driver.closed()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let bytes = unwrapInboundIn(data)
        driver.bytesReceived(bytes.readableBytes)
        guard !driver.closeSent else { return }
        parser.append(bytes)
        parseFrames(context: context)
    }

    /// Takes the parsed frames in order, one at a time: a frame whose messages are with the broker holds the
    /// next ones in the parser until it is handled (`ConnectionStateMachine.frameStarted`).
    private func parseFrames(context: ChannelHandlerContext) {
        guard !parsing else { return }
        parsing = true
        defer { parsing = false }
        do {
            while !driver.closeSent, !driver.isHandlingFrame, let frame = try parser.next() {
                handleFrame(frame, context: context)
            }
        } catch {
            frameError(error, context: context)
        }
    }

    private func handleFrame(_ frame: WebSocketFrame, context: ChannelHandlerContext) {
        switch frame.opcode {
        case .text, .binary:
            guard let payload = payload(of: frame, context: context) else { return }
            handleMessage(payload, binary: frame.opcode == .binary, context: context)
        case .ping:
            writeFrame(.pong, frame.data, context: context)
        case .connectionClose:
            // The client's status code echoed (RFC 6455 §5.5.1; the parser checked it), or none to none.
            close(code: frame.data.peekWebSocketErrorCode(), context: context)
        default:
            break
        }
    }

    /// A frame or message over the limit (1009), a frame that breaks the protocol (1002), text that is not UTF-8
    /// (1007).
    func frameError(_ error: WebSocketFrameParser.ParseError, context: ChannelHandlerContext) {
        switch error {
        case .tooLarge: fail(.messageTooLarge, .websocketTooLarge, "websocket message over the limit", context: context)
        case .protocolError: fail(.protocolError, .websocketProtocol, "websocket protocol error", context: context)
        case .invalidUTF8:
            fail(.dataInconsistentWithMessage, .websocketProtocol, "websocket text not UTF-8", context: context)
        case .corruptCompression:
            fail(
                .dataInconsistentWithMessage, .websocketProtocol, "websocket message does not inflate", context: context
            )
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is IOError {
            fail(.protocolError, .connection, "websocket connection error", error, level: .debug, context: context)
        } else {
            fail(.protocolError, .websocketProtocol, "websocket protocol error", error, context: context)
        }
    }

    private func fail(
        _ code: WebSocketErrorCode, _ kind: RequestErrorKind, _ message: Logger.Message, _ error: (any Error)? = nil,
        level: Logger.Level = .info, context: ChannelHandlerContext
    ) {
        shared.operations.metrics.error(kind)
        var metadata: Logger.Metadata = ["pubsub.remote": "\(context.channel.remoteAddress?.description ?? "?")"]
        if let error { metadata["pubsub.error"] = "\(error)" }
        shared.logger.log(level: level, message, metadata: metadata)
        close(code: code, context: context)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        driver.writabilityChanged(isWritable: context.channel.isWritable)
        context.fireChannelWritabilityChanged()
    }

    /// Reading waits while writes drain and while a frame is handled.
    func read(context: ChannelHandlerContext) {
        if driver.readRequested() { context.read() }
    }

    private func handleMessage(_ payload: ByteBuffer, binary: Bool, context: ChannelHandlerContext) {
        let value: JSONValue
        do {
            value = try JSONParser(maxDepth: shared.configuration.maxJSONDepth).parse(payload)
        } catch {
            shared.logger.debug("invalid JSON on websocket", metadata: ["pubsub.error": "\(error)"])
            if !binary, !WebSocketFrameParser.isValidUTF8(payload) {
                // A text frame that is not UTF-8 fails the WebSocket connection (RFC 6455: 1007).
                close(code: .dataInconsistentWithMessage, context: context)
                return
            }
            // Garbage in a binary frame is answered as garbage in a text frame: the session goes on.
            write(replies: [ReplyEncoder.badRequest], events: .noEvents, context: context)
            return
        }
        guard let elements = MessageBatch.elements(of: value) else {
            write(replies: [ReplyEncoder.badRequest], events: .noEvents, context: context)
            return
        }
        if elements.isEmpty {
            writeFrame(.text, ByteBuffer(string: "[]"), context: context)
            return
        }
        driver.handle(admitted(elements))
    }

    /// The frame's messages, its publishes refused when they exceed the publish limits (the same buckets as
    /// HTTP's: a frame is refused whole, as a request is). A refused publish gets `successful: false` and
    /// `429:<channel>,<seconds to wait>:Publish rate limit exceeded` in its reply; the frame's meta messages are
    /// handled as usual, so a connect sent with them is not lost.
    private func admitted(_ elements: [MessageBatch.Element]) -> [MessageBatch.Element] {
        guard let keys = publishLimitKeys,
            let (verdict, _, refusal) = shared.operations.checkPublishLimits(elements, keys: keys), refusal != nil
        else { return elements }
        let retryAfter = String(verdict.retryAfterSeconds)
        return elements.map { element in
            guard case .message(var message) = element, let channel = message.channel, !Channel.isMeta(channel)
            else { return element }
            message.error = BayeuxError(Self.publishRateLimited, channel, retryAfter).description
            return .message(message)
        }
    }

    static let publishRateLimited = BayeuxError.Code(429, "Publish rate limit exceeded")

    // MARK: ConnectionTransport

    func send(replies: [Message], events: CircularBuffer<WireEvent>) {
        guard let context else { return }
        write(replies: replies, events: events, context: context)
    }

    /// Silent for the ping interval: a ping, answered by any live peer's pong.
    func sendHeartbeat() {
        guard let context, !driver.closeSent else { return }
        writeFrame(.ping, ByteBuffer(), context: context)
    }

    func close(_ reason: ConnectionStateMachine.CloseReason) {
        guard let context else { return }
        close(code: reason.webSocketCode, context: context)
    }

    func resumeReading() { context?.read() }

    func requestFailed(_ error: any Error) {
        guard let context else { return }
        write(replies: [ReplyEncoder.serverError], events: .noEvents, context: context)
    }

    func batchHandled() {
        guard let context else { return }
        parseFrames(context: context)
    }

    func abort(_ reason: ConnectionGuardState.CloseReason) {
        guard let context else { return }
        let remote = context.channel.remoteAddress?.description ?? "?"
        shared.logger.debug(
            "closing connection", metadata: ["pubsub.reason": "\(reason.rawValue)", "pubsub.remote": "\(remote)"])
        context.close(promise: nil)
    }

    var unsentBytes: Int {
        (try? context?.channel.syncOptions?.getOption(ChannelOptions.bufferedWritableBytes)) ?? 0
    }

    private func write(replies: [Message], events: CircularBuffer<WireEvent>, context: ChannelHandlerContext) {
        guard !driver.closeSent else { return }
        if parser.compressed, writeCompressed(replies: replies, events: events, context: context) { return }
        if replies.isEmpty, events.count == 1, let only = events.first {
            // A lone event goes as the frame every recipient shares: no header of its own, one write.
            driver.counters.bytesOut &+= UInt64(only.json.readableBytes)
            context.writeAndFlush(wrapOutboundOut(.byteBuffer(only.frame)), promise: nil)
            return
        }
        let payload = ReplyEncoder.encode(
            replies: replies, events: events, allocator: context.channel.allocator,
            headroom: WebSocketFrameHeader.maxLength)
        driver.counters.bytesOut &+= UInt64(payload.readableBytes)
        writeFrame(.text, payload, context: context)
    }

    func writeFrame(
        _ opcode: WebSocketOpcode, _ payload: ByteBuffer, context: ChannelHandlerContext,
        promise: EventLoopPromise<Void>? = nil
    ) {
        let (first, rest) = WebSocketFrameHeader.frame(
            opcode: opcode, payload: payload, allocator: context.channel.allocator)
        guard let rest else { return context.writeAndFlush(wrapOutboundOut(.byteBuffer(first)), promise: promise) }
        context.write(wrapOutboundOut(.byteBuffer(first)), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.byteBuffer(rest)), promise: promise)
    }

    /// Sends the close frame, once (the machine keeps whether it went out), and closes once it is written.
    private func close(code: WebSocketErrorCode?, context: ChannelHandlerContext) {
        guard driver.sendingClose() else { return }
        let closed = context.eventLoop.makePromise(of: Void.self)
        let data = WebSocketFrameHeader.closePayload(code, allocator: context.channel.allocator)
        writeFrame(.connectionClose, data, context: context, promise: closed)
        closed.futureResult.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }
}
