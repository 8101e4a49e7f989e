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
/// handler decodes frames and hands them to the driver (messages, pings, closes, frames it cannot read), and writes
/// and closes only as the driver says. While the socket is not writable it is not read, and delivered events wait
/// in the machine, up to `maxQueue`, past which the client is dropped. It reads and writes the socket's bytes
/// itself (`WebSocketFrameParser`, `WebSocketFrameHeader`): one handler where NIO's encoder, decoder, aggregator
/// and error handler were four.
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

    /// Takes the parsed frames in order, while the connection takes frames (`FramesInFlight`: publishes follow
    /// one another to the broker, any other frame waits for those before it and holds the next ones here).
    private func parseFrames(context: ChannelHandlerContext) {
        guard !parsing else { return }
        parsing = true
        defer { parsing = false }
        do {
            while !driver.closeSent, driver.takesFrames, let frame = try parser.next() {
                handleFrame(frame, context: context)
            }
        } catch {
            frameError(error, context: context)
        }
    }

    private func handleFrame(_ frame: WebSocketFrameParser.Frame, context: ChannelHandlerContext) {
        switch frame.opcode {
        case .text, .binary:
            guard let payload = payload(of: frame, context: context) else { return }
            handleMessage(payload, binary: frame.opcode == .binary, context: context)
        case .ping:
            driver.pingReceived(frame.data)
        case .connectionClose:
            // The client's status code echoed (RFC 6455 §5.5.1; the parser checked it), or none to none.
            driver.closeNow(
                .peerClosed(code: frame.data.peekWebSocketErrorCode().map(UInt16.init(webSocketErrorCode:))))
        default:
            break
        }
    }

    /// A frame or message over the limit (1009), a frame that breaks the protocol (1002), text that is not UTF-8
    /// (1007).
    func frameError(_ error: WebSocketFrameParser.ParseError, context: ChannelHandlerContext) {
        switch error {
        case .tooLarge: driver.failed(.tooLarge, .websocketTooLarge, "websocket message over the limit")
        case .protocolError: driver.failed(.protocolError, .websocketProtocol, "websocket protocol error")
        case .invalidUTF8: driver.failed(.invalidData, .websocketProtocol, "websocket text not UTF-8")
        case .corruptCompression: driver.failed(.invalidData, .websocketProtocol, "websocket message does not inflate")
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is IOError {
            driver.failed(.protocolError, .connection, "websocket connection error", error, level: .debug)
        } else {
            driver.failed(.protocolError, .websocketProtocol, "websocket protocol error", error)
        }
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
            // A text frame that is not UTF-8 fails the WebSocket connection (RFC 6455: 1007); garbage in a binary
            // frame is answered as garbage in a text frame: the session goes on.
            if !binary, !WebSocketFrameParser.isValidUTF8(payload) { return driver.closeNow(.invalidData) }
            return driver.answerAtOnce([ReplyEncoder.badRequest])
        }
        guard let elements = MessageBatch.elements(of: value) else {
            return driver.answerAtOnce([ReplyEncoder.badRequest])
        }
        if elements.isEmpty { return driver.answerAtOnce([]) }
        driver.handleFrame(shared.operations.admitted(elements, keys: publishLimitKeys), bytes: payload.readableBytes)
    }

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

    func sendPong(_ payload: ByteBuffer) {
        if let context { writeFrame(.pong, payload, context: context) }
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
        if let context { parseFrames(context: context) }
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
        writeFrame(.text, consume payload, context: context)  // moved: its header goes in the room in front
    }

    func writeFrame(
        _ opcode: WebSocketOpcode, _ payload: consuming ByteBuffer, context: ChannelHandlerContext,
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
