import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import NIOWebSocket
import PubSubCore

/// Bayeux over one WebSocket. Each text frame holds one message or an array; the replies to a frame go out as
/// one frame, at once, except a held `/meta/connect`, whose reply follows when its hold ends or a newer connect
/// supersedes it. Events are pushed as they arrive: everything pending for the socket in one frame. A binary
/// frame is read as UTF-8 JSON like a text frame (as Faye's Node server does; iOS and Java clients send them).
///
/// What to send when is the `ConnectionStateMachine`'s: this handler decodes frames, feeds the machine and
/// performs its actions. While the socket is not writable (`maxOutboundBytes` waiting) it is not read, and
/// delivered events wait in the machine, up to `maxQueue`, past which the client is dropped.
///
/// It reads and writes the socket's bytes itself (`WebSocketFrameParser`, `WebSocketFrameHeader`): one handler
/// where NIO's frame encoder, decoder, aggregator and error handler were four, each with its pipeline context,
/// kept for as long as the socket is open.
final class WebSocketHandler: ChannelDuplexHandler, ConnectionSinkOwner, TimerQueueOwner {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = IOData
    typealias OutboundOut = IOData

    let shared: ServerShared
    private var context: ChannelHandlerContext?
    private var machine: ConnectionStateMachine
    /// The sink of the bound client, if any.
    private var sink: ConnectionSink?
    /// The timers of this connection's loop: this connection's one entry there is due at the earlier of the held
    /// connect's hold and the next deadline of `guardState`.
    private var timers: LoopTimers?
    private var holdDeadline: NIODeadline?
    /// The ping, send and silence timeouts, taken over from the `ConnectionGuard`, which leaves the pipeline when
    /// this handler joins it; nil when there was no guard (tests of this handler alone).
    private var guardState: ConnectionGuardState?
    var timerQueueIndex = -1
    private var closing = false
    /// Inside `parseFrames` (a frame handled at once finishes within it: the loop goes on by itself).
    private var parsing = false
    private var parser: WebSocketFrameParser
    private let requestContext: RequestContext
    /// This loop's counters (bytes out, open WebSockets).
    private var counters: LoopCounters?

    init(shared: ServerShared, remoteAddress: String?, upgradeHeaders: HTTPHeaders = [:]) {
        self.shared = shared
        let maxFrame = shared.configuration.maxFrameBytes
        self.parser = WebSocketFrameParser(maxFrameSize: maxFrame, maxMessageSize: maxFrame, maxFragments: 4096)
        self.machine = ConnectionStateMachine(transport: .webSocket, maxQueue: shared.configuration.broker.maxQueue)
        self.requestContext = RequestContext(
            connectionType: .websocket, remoteAddress: remoteAddress,
            headers: RequestContext.authorizationHeaders(upgradeHeaders))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        timers = shared.guardSettings.loopTimers.timers(for: context.eventLoop)
        counters = shared.operations.loopCounters.counters(for: context.eventLoop)
        counters?.attached(.websocket)
        if !context.channel.isWritable { perform(machine.writabilityChanged(isWritable: false), context: context) }
        // The WebSocket is timed here from now on (pings, silence, blocked writes): the guard hands over and leaves.
        let sync = context.pipeline.syncOperations
        if let connectionGuard = try? sync.handler(type: ConnectionGuard.self) {
            var state = connectionGuard.handOver()
            state.upgraded(now: context.eventLoop.now)
            state.writabilityChanged(
                isWritable: context.channel.isWritable, unsentBytes: Self.unsentBytes(context), now: context.eventLoop.now)
            guardState = state
            sync.removeHandler(connectionGuard, promise: nil)
            rearm()
        }
    }

    /// When the connection's timer entry is next due: the hold's end or the guard's next deadline.
    private func rearm() {
        guard let timers else { return }
        var next = holdDeadline
        if let deadline = guardState?.deadline { next = next.map { min($0, deadline) } ?? deadline }
        guard let next else {
            timers.cancel(self)
            return
        }
        // A later deadline leaves the entry as it is: it comes early, finds nothing due and re-arms.
        if let armed = timers.deadline(of: self), armed <= next { return }
        timers.schedule(self, at: next)
    }

    private static func unsentBytes(_ context: ChannelHandlerContext) -> Int {
        (try? context.channel.syncOptions?.getOption(ChannelOptions.bufferedWritableBytes)) ?? 0
    }

    /// The server is draining: answer a held connect, send what is waiting, close with 1001.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard event is ChannelShouldQuiesceEvent else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        perform(machine.quiesce(), context: context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timers?.cancel(self)
        self.context = nil
    }

    /// The hold of the held connect ended, or a deadline of the guard's came.
    func timerQueueDeadlineReached() {
        guard let context else { return }
        let now = context.eventLoop.now
        if let holdDeadline, now >= holdDeadline {
            self.holdDeadline = nil
            perform(machine.holdTimerFired(), context: context)
        }
        if guardState != nil, self.context != nil {
            switch guardState!.timerFired(now: now, unsentBytes: Self.unsentBytes(context)) {
            case .none:
                break
            case .ping:
                // Silent for the ping interval: a ping, answered by any live peer's pong.
                if !closing { writeFrame(.ping, ByteBuffer(), context: context) }
            case .close(let reason):
                shared.logger.debug(
                    "closing connection",
                    metadata: [
                        "pubsub.reason": "\(reason.rawValue)",
                        "pubsub.remote": "\(context.channel.remoteAddress?.description ?? "?")",
                    ])
                context.close(promise: nil)
                return
            }
        }
        rearm()
    }

    func channelInactive(context: ChannelHandlerContext) {
        guardState?.closed()
        holdDeadline = nil
        timers?.cancel(self)
        counters?.detached(.websocket)
        counters = nil
        perform(machine.closed(), context: context)
        sink?.closed = true
        sink = nil
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let bytes = unwrapInboundIn(data)
        // Any byte is a sign of life (a later deadline: the armed entry stays as it is).
        _ = guardState?.bytesReceived(bytes.readableBytes, now: context.eventLoop.now)
        guard !closing else { return }
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
            while !closing, !machine.isHandlingFrame, let frame = try parser.next() { handleFrame(frame, context: context) }
        } catch {
            frameError(error, context: context)
        }
    }

    private func handleFrame(_ frame: WebSocketFrame, context: ChannelHandlerContext) {
        switch frame.opcode {
        case .text:
            handleMessage(frame.data, binary: false, context: context)
        case .binary:
            handleMessage(frame.data, binary: true, context: context)
        case .ping:
            writeFrame(.pong, frame.data, context: context)
        case .connectionClose:
            close(code: nil, context: context)
        default:
            break
        }
    }

    /// A frame or message over the limit (1009), or a frame that breaks the protocol (1002).
    private func frameError(_ error: WebSocketFrameParser.ParseError, context: ChannelHandlerContext) {
        let remote = context.channel.remoteAddress?.description ?? "?"
        switch error {
        case .tooLarge:
            shared.operations.metrics.error(.websocketTooLarge)
            shared.logger.info("websocket message over the limit", metadata: ["pubsub.remote": "\(remote)"])
            close(code: .messageTooLarge, context: context)
        case .protocolError:
            shared.operations.metrics.error(.websocketProtocol)
            shared.logger.info("websocket protocol error", metadata: ["pubsub.remote": "\(remote)"])
            close(code: .protocolError, context: context)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        let remote = context.channel.remoteAddress?.description ?? "?"
        if error is IOError {
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
        if guardState != nil {
            guardState!.writabilityChanged(
                isWritable: context.channel.isWritable, unsentBytes: Self.unsentBytes(context), now: context.eventLoop.now)
            rearm()
        }
        perform(machine.writabilityChanged(isWritable: context.channel.isWritable), context: context)
        context.fireChannelWritabilityChanged()
    }

    /// Reading waits while writes drain.
    func read(context: ChannelHandlerContext) {
        if machine.readRequested() == .read { context.read() }
    }

    private func handleMessage(_ payload: ByteBuffer, binary: Bool, context: ChannelHandlerContext) {
        let value: JSONValue
        do {
            value = try JSONParser(maxDepth: shared.configuration.maxJSONDepth).parse(payload)
        } catch {
            shared.logger.debug("invalid JSON on websocket", metadata: ["pubsub.error": "\(error)"])
            if !binary, !Self.isValidUTF8(payload) {
                // A text frame that is not UTF-8 fails the WebSocket connection (RFC 6455: 1007).
                close(code: .dataInconsistentWithMessage, context: context)
                return
            }
            // Garbage in a binary frame is answered as garbage in a text frame: the session goes on.
            write(replies: [Self.badRequestReply], events: .noEvents, context: context)
            return
        }
        guard let elements = MessageBatch.elements(of: value) else {
            write(replies: [Self.badRequestReply], events: .noEvents, context: context)
            return
        }
        if elements.isEmpty {
            writeFrame(.text, ByteBuffer(string: "[]"), context: context)
            return
        }
        // The socket is bound to the client of the first connect in the frame.
        for element in elements {
            guard case .message(let message) = element, message.channel == Channel.connect,
                let clientId = message.clientId
            else { continue }
            if machine.clientId != clientId {
                perform(machine.bind(clientId: clientId), context: context)
                sink = ConnectionSink(owner: self, isPersistent: true, eventLoop: context.eventLoop)
            }
            break
        }
        let broker = shared.broker
        machine.frameStarted()
        broker.handle(elements, context: requestContext, sink: sink, now: .now(), on: context.eventLoop)
            .assumeIsolated().whenComplete { result in
                if case .success(let outcomes) = result {
                    let (replies, events, pending) = broker.split(outcomes, context: self.requestContext)
                    self.perform(
                        self.machine.messagesHandled(replies: replies, events: events, pending: pending), context: context)
                } else {
                    self.write(replies: [Self.serverErrorReply], events: .noEvents, context: context)
                }
                self.perform(self.machine.frameFinished(), context: context)
                self.parseFrames(context: context)
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

    // MARK: The sink

    func deliver(_ sink: ConnectionSink, events: CircularBuffer<ByteBuffer>) {
        guard sink === self.sink, let context else { return }
        switch machine.eventsDelivered(events) {
        case .none: break
        case .write(let events): write(replies: [], events: events, context: context)
        case .answer(let answer): self.answer(answer, context: context)
        case .drop(let clientId): drop(clientId, context: context)
        }
    }

    func detached(_ sink: ConnectionSink, reason: DetachReason) {
        guard sink === self.sink, let context else { return }
        sink.closed = true
        self.sink = nil
        if reason == .overflow, let clientId = machine.clientId {
            shared.broker.logDropped(clientId, transport: .websocket)
        }
        perform(machine.detached(reason), context: context)
    }

    // MARK: Actions

    private func perform(_ actions: [ConnectionStateMachine.Action], context: ChannelHandlerContext) {
        for action in actions {
            switch action {
            case .write(let replies, let events):
                write(replies: replies, events: events, context: context)
            case .answer(let answer):
                self.answer(answer, context: context)
            case .armHoldTimer(let hold):
                holdDeadline = context.eventLoop.now + hold
                rearm()
            case .cancelHoldTimer:
                holdDeadline = nil
            case .resumeReading:
                context.read()
            case .detach(let clientId):
                if let sink {
                    sink.closed = true
                    self.sink = nil
                    shared.broker.detach(clientId, sink: sink, takeEvents: false)
                }
            case .drop(let clientId):
                drop(clientId, context: context)
            case .close(let reason):
                switch reason {
                case .normal: close(code: .normalClosure, context: context)
                case .goingAway: close(code: .goingAway, context: context)
                case .overflow: close(code: .policyViolation, context: context)
                }
            case .heartbeat:
                break
            }
        }
    }

    /// Sends the reply of the held connect (its hold ended, or it was superseded or released).
    private func answer(_ answer: ConnectionStateMachine.Answer, context: ChannelHandlerContext) {
        holdDeadline = nil
        let reply = answer.reply
        var replies = answer.replies
        if let finished = shared.broker.finish(reply, context: requestContext) { replies.append(finished) }
        if !replies.isEmpty || !answer.events.isEmpty {
            write(replies: replies, events: answer.events, context: context)
        }
    }

    /// A slow consumer: more than `maxQueue` events wait on a socket that is not writable.
    private func drop(_ clientId: String, context: ChannelHandlerContext) {
        if let sink {
            sink.closed = true
            self.sink = nil
        }
        shared.broker.drop(clientId, transport: .websocket, on: context.eventLoop)
        close(code: .policyViolation, context: context)
    }

    private func write(replies: [Message], events: CircularBuffer<ByteBuffer>, context: ChannelHandlerContext) {
        guard !closing else { return }
        let payload = ReplyEncoder.encode(
            replies: replies, events: events, allocator: context.channel.allocator,
            headroom: WebSocketFrameHeader.maxLength)
        counters?.bytesOut &+= UInt64(payload.readableBytes)
        writeFrame(.text, payload, context: context)
    }

    /// One final, unmasked frame: an event shared by every recipient carries its header already (`EventFrame`),
    /// written when it was encoded, and goes as it is; a reply built here gets its header in its headroom; any
    /// other payload gets a small header buffer of its own (a shared buffer is never written into).
    private func writeFrame(
        _ opcode: WebSocketOpcode, _ payload: ByteBuffer, context: ChannelHandlerContext,
        promise: EventLoopPromise<Void>? = nil
    ) {
        if opcode == .text, let frame = EventFrame.webSocketFrame(of: payload) {
            context.writeAndFlush(wrapOutboundOut(.byteBuffer(frame)), promise: promise)
            return
        }
        var payload = payload
        if WebSocketFrameHeader.prepend(opcode: opcode, to: &payload) {
            context.writeAndFlush(wrapOutboundOut(.byteBuffer(payload)), promise: promise)
            return
        }
        let header = WebSocketFrameHeader.buffer(
            opcode: opcode, payloadLength: payload.readableBytes, allocator: context.channel.allocator)
        if payload.readableBytes == 0 {
            context.writeAndFlush(wrapOutboundOut(.byteBuffer(header)), promise: promise)
            return
        }
        context.write(wrapOutboundOut(.byteBuffer(header)), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.byteBuffer(payload)), promise: promise)
    }

    private func close(code: WebSocketErrorCode?, context: ChannelHandlerContext) {
        guard !closing else { return }
        closing = true
        machine.closing()
        var data = context.channel.allocator.buffer(capacity: 2 + WebSocketFrameHeader.maxLength)
        data.moveWriterIndex(forwardBy: WebSocketFrameHeader.maxLength)
        data.moveReaderIndex(forwardBy: WebSocketFrameHeader.maxLength)
        if let code { data.write(webSocketErrorCode: code) }
        let closed = context.eventLoop.makePromise(of: Void.self)
        writeFrame(.connectionClose, data, context: context, promise: closed)
        closed.futureResult.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }
}
