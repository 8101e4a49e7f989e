import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import NIOWebSocket
import PubSubCore

/// Bayeux over one WebSocket. Each text frame holds one message or an array; the replies to a frame go out as
/// one frame, at once, except a held `/meta/connect`, whose reply follows when its hold ends or a newer connect
/// supersedes it. Events are pushed as they arrive: everything pending for the socket in one frame.
final class WebSocketHandler: ChannelInboundHandler {
    typealias InboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    let shared: ServerShared
    private var context: ChannelHandlerContext?
    private var sink: WebSocketSink?
    private var held: (connect: PendingConnect, timer: Scheduled<Void>)?
    /// Events waiting while the socket is not writable; bounded by the per-client queue limit.
    private var backlog = CircularBuffer<ByteBuffer>(initialCapacity: 1)
    private var closing = false
    private let requestContext: RequestContext
    /// This loop's counters (bytes out, open WebSockets).
    private var counters: LoopCounters?

    init(shared: ServerShared, remoteAddress: String?, upgradeHeaders: HTTPHeaders = [:]) {
        self.shared = shared
        self.requestContext = RequestContext(
            connectionType: .websocket, remoteAddress: remoteAddress,
            headers: RequestContext.authorizationHeaders(upgradeHeaders))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        counters = shared.operations.loopCounters.counters(for: context.eventLoop)
        counters?.attached(.websocket)
    }

    /// The server is draining: answer a held connect, send what is waiting, close with 1001.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard event is ChannelShouldQuiesceEvent else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        answerHeld(context: context)
        if !backlog.isEmpty {
            let events = backlog
            backlog = []
            let payload = ReplyEncoder.encode(replies: [], events: events, allocator: context.channel.allocator)
            context.write(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .text, data: payload)), promise: nil)
        }
        close(code: .goingAway, context: context)
    }

    func channelInactive(context: ChannelHandlerContext) {
        counters?.detached(.websocket)
        counters = nil
        held?.timer.cancel()
        held = nil
        if let sink {
            sink.closed = true
            _ = shared.broker.engine.detach(sink.clientId, sink: sink, takeEvents: false)
        }
        sink = nil
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        switch frame.opcode {
        case .text:
            guard !closing else { return }
            handleMessage(frame.unmaskedData, context: context)
        case .binary:
            // Bayeux travels in text frames; a binary frame is refused as RFC 6455 says (1003).
            close(code: .unacceptableData, context: context)
        case .ping:
            let pong = WebSocketFrame(fin: true, opcode: .pong, data: frame.unmaskedData)
            context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
        case .connectionClose:
            close(code: nil, context: context)
        default:
            break
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        let remote = context.channel.remoteAddress?.description ?? "?"
        if let error = error as? NIOWebSocketFrameAggregator.Error, error == .accumulatedFrameSizeIsTooLarge {
            shared.operations.metrics.error(.websocketTooLarge)
            shared.logger.info("websocket message over the limit", metadata: ["pubsub.remote": "\(remote)"])
            close(code: .messageTooLarge, context: context)
        } else if error is IOError {
            shared.operations.metrics.error(.connection)
            shared.logger.debug("websocket connection error", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
            close(code: .protocolError, context: context)
        } else {
            shared.operations.metrics.error(.websocketProtocol)
            shared.logger.info("websocket protocol error", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
            close(code: .protocolError, context: context)
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable, !backlog.isEmpty {
            let events = backlog
            backlog = []
            send(replies: [], events: events, context: context)
        }
        context.fireChannelWritabilityChanged()
    }

    private func handleMessage(_ payload: ByteBuffer, context: ChannelHandlerContext) {
        let value: JSONValue
        do {
            value = try JSONParser(maxDepth: shared.configuration.maxJSONDepth).parse(payload)
        } catch {
            shared.logger.debug("invalid JSON on websocket", metadata: ["pubsub.error": "\(error)"])
            if !Self.isValidUTF8(payload) {
                // A text frame that is not UTF-8 fails the WebSocket connection (RFC 6455: 1007).
                close(code: .dataInconsistentWithMessage, context: context)
                return
            }
            send(replies: [Self.badRequestReply], events: [], context: context)
            return
        }
        guard let elements = MessageBatch.elements(of: value) else {
            send(replies: [Self.badRequestReply], events: [], context: context)
            return
        }
        if elements.isEmpty {
            context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(string: "[]"))),
                promise: nil)
            return
        }
        // The socket is bound to the client of the first connect in the frame.
        for element in elements {
            guard case .message(let message) = element, message.channel == Channel.connect,
                let clientId = message.clientId
            else { continue }
            if sink?.clientId != clientId { bind(clientId, context: context) }
            break
        }
        let broker = shared.broker
        broker.handle(elements, context: requestContext, sink: sink, now: .now(), on: context.eventLoop)
            .assumeIsolated().whenComplete { result in
                guard case .success(let outcomes) = result else {
                    self.send(replies: [Self.serverErrorReply], events: [], context: context)
                    return
                }
                let (replies, events, pending) = broker.split(outcomes, context: self.requestContext)
                if let pending {
                    self.answerHeld(context: context)
                    let timer = context.eventLoop.assumeIsolated().scheduleTask(in: pending.hold) { [weak self] in
                        guard let self else { return }
                        self.answerHeld(context: context)
                    }
                    self.held = (pending, timer)
                }
                if !replies.isEmpty || !events.isEmpty {
                    self.send(replies: replies, events: events, context: context)
                }
            }
    }

    static func isValidUTF8(_ buffer: ByteBuffer) -> Bool {
        buffer.withUnsafeReadableBytes { String(validating: $0, as: UTF8.self) != nil }
    }

    static let badRequestReply: Message = {
        var m = Message()
        m.fail(BayeuxError.badRequest)
        return m
    }()

    static let serverErrorReply: Message = {
        var m = Message()
        m.fail(BayeuxError(.serverError))
        return m
    }()

    private func bind(_ clientId: String, context: ChannelHandlerContext) {
        if let old = sink {
            old.closed = true
            _ = shared.broker.engine.detach(old.clientId, sink: old, takeEvents: false)
            answerHeld(context: context)
        }
        sink = WebSocketSink(handler: NIOLoopBound(self, eventLoop: context.eventLoop), clientId: clientId)
    }

    /// Sends the reply of the held connect, if any (its hold ended, or it was superseded or released).
    private func answerHeld(context: ChannelHandlerContext, failure: BayeuxError? = nil) {
        guard let (connect, timer) = held else { return }
        held = nil
        timer.cancel()
        var reply = connect.reply
        if let failure {
            reply.fail(failure)
            reply.clientId = nil
            reply["advice"] = Advice.handshake
        }
        if let finished = shared.broker.finish(reply, context: requestContext) {
            send(replies: [finished], events: [], context: context)
        }
    }

    func deliver(_ sink: WebSocketSink, events: CircularBuffer<ByteBuffer>) {
        guard sink === self.sink, let context else { return }
        send(replies: [], events: events, context: context)
    }

    func detached(_ sink: WebSocketSink, reason: DetachReason) {
        guard sink === self.sink, let context else { return }
        self.sink = nil
        switch reason {
        case .superseded:
            answerHeld(context: context)
        case .overflow:
            answerHeld(context: context, failure: BayeuxError(.queueOverflow, sink.clientId))
        case .disconnected, .expired:
            answerHeld(context: context)
            close(code: .normalClosure, context: context)
        case .shutdown:
            answerHeld(context: context)
            close(code: .goingAway, context: context)
        }
    }

    private func send(replies: [Message], events: CircularBuffer<ByteBuffer>, context: ChannelHandlerContext) {
        guard !closing else { return }
        if replies.isEmpty, !context.channel.isWritable {
            backlog.append(contentsOf: events)
            if backlog.count > shared.configuration.broker.maxQueue, let sink {
                shared.logger.info("slow websocket consumer dropped", metadata: ["pubsub.client.id": "\(sink.clientId)"])
                backlog = []
                _ = shared.broker.engine.destroyClient(sink.clientId, reason: .overflow, on: context.eventLoop)
                close(code: .policyViolation, context: context)
            }
            return
        }
        var events = events
        if !backlog.isEmpty {
            backlog.append(contentsOf: events)
            events = backlog
            backlog = []
        }
        let payload = ReplyEncoder.encode(replies: replies, events: events, allocator: context.channel.allocator)
        counters?.bytesOut &+= UInt64(payload.readableBytes)
        context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .text, data: payload)), promise: nil)
    }

    private func close(code: WebSocketErrorCode?, context: ChannelHandlerContext) {
        guard !closing else { return }
        closing = true
        var data = context.channel.allocator.buffer(capacity: 2)
        if let code { data.write(webSocketErrorCode: code) }
        let frame = WebSocketFrame(fin: true, opcode: .connectionClose, data: data)
        context.writeAndFlush(wrapOutboundOut(frame)).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }
}

/// The delivery sink of a WebSocket bound to one client.
final class WebSocketSink: DeliverySink, @unchecked Sendable {
    private let handler: NIOLoopBound<WebSocketHandler>
    let clientId: String
    /// Set on the event loop once the socket is gone or rebound.
    var closed = false

    var eventLoop: any EventLoop { handler.eventLoop }
    var isPersistent: Bool { true }

    init(handler: NIOLoopBound<WebSocketHandler>, clientId: String) {
        self.handler = handler
        self.clientId = clientId
    }

    func deliver(_ events: CircularBuffer<ByteBuffer>) {
        guard !closed else { return }
        handler.value.deliver(self, events: events)
    }

    func detached(_ reason: DetachReason) {
        guard !closed else { return }
        handler.value.detached(self, reason: reason)
    }
}
