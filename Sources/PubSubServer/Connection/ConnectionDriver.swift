import Bayeux
import Logging
import NIOCore
import PubSubCore

/// What differs between the transports that carry a connection's Bayeux delivery: WebSocket frames, HTTP
/// responses (long-polling, cross-origin, JSON-P) and EventSource stream writes. The `ConnectionDriver` decides;
/// its transport only writes and closes. Called on the connection's event loop.
protocol ConnectionTransport: AnyObject {
    /// Writes replies, then events: one WebSocket frame, one HTTP response, or events on the stream.
    func send(replies: [Message], events: CircularBuffer<WireEvent>)
    /// A sign of life: an EventSource comment line, a WebSocket ping.
    func sendHeartbeat()
    /// Answers a WebSocket ping.
    func sendPong(_ payload: ByteBuffer)
    /// Ends the connection for `reason`: a WebSocket close frame, the end of a stream.
    func close(_ reason: ConnectionStateMachine.CloseReason)
    /// Asks the channel for the read that was withheld while writes drained or a frame was handled.
    func resumeReading()
    /// The broker failed on a request or frame (its messages are lost): a 500, an error reply.
    func requestFailed(_ error: any Error)
    /// The broker handled a request or frame: the next may be taken.
    func batchHandled()
    /// Closes at once, without a goodbye: a keep-alive timeout came (`keepAlive`).
    func abort(_ reason: ConnectionGuardState.CloseReason)
    /// Bytes written to the channel and not yet taken by the socket (for the send timeout).
    var unsentBytes: Int { get }
}

extension ConnectionTransport {
    func sendPong(_ payload: ByteBuffer) {}
    func batchHandled() {}
    func abort(_ reason: ConnectionGuardState.CloseReason) { close(.normal) }
    var unsentBytes: Int { 0 }
}

/// Drives one connection's `ConnectionStateMachine` and performs every action it returns, in this one place,
/// for every transport: it owns the connection's sink (by generation), its entry in the loop's `LoopTimers` (the
/// held connect's hold, EventSource heartbeats, a WebSocket's pings and silence), and its count among the
/// attached clients. The handlers decode and encode; this decides when and what.
///
/// The handler owns its driver; the driver points back at it unowned, and reaches it only through `live`, which
/// is nil once the connection is closed: a sink an engine still holds, or a broker answer that comes late, may
/// keep the driver past its handler, never calling it.
final class ConnectionDriver: TimerQueueOwner {
    private var machine: ConnectionStateMachine
    private unowned let transport: any ConnectionTransport
    private let shared: ServerShared
    private let timers: LoopTimers
    /// This loop's counters (bytes out, attached clients).
    let counters: LoopCounters
    /// The sink offered to the connect of the request being handled, parked, of the socket or of the stream.
    private var sink: ConnectionSink?
    /// The generation of `sink`; moved on whenever it is let go, so that the calls of older sinks are ignored.
    private var generation: UInt32 = 0
    /// How the attached client is counted (`pubsub_clients`): an open WebSocket, a parked connect, a stream.
    /// Beside `generation`, in its padding: the driver is 328 bytes, malloc's 336-byte chunk, not its 352.
    private var attachedType: ConnectionType? {
        didSet {
            if let oldValue, oldValue != attachedType { counters.detached(oldValue) }
            if let attachedType, attachedType != oldValue { counters.attached(attachedType) }
        }
    }
    var timerQueueIndex = -1
    /// When the held connect's hold ends. The timer entry may be earlier (left from a hold answered before: it
    /// fires early and is moved), never later, so answering a poll and parking the next take no heap work.
    private var holdDeadline: NIODeadline?
    /// The context of the latest request or frame: the connect reply's outgoing extensions use it.
    private var requestContext: RequestContext

    /// `context`: a WebSocket's, for all its frames; a polling connection's are its requests'.
    init(transport: any ConnectionTransport, context: RequestContext, shared: ServerShared, eventLoop: any EventLoop) {
        self.machine = ConnectionStateMachine(
            transport: context.connectionType == .websocket ? .webSocket : .polling,
            maxQueue: shared.configuration.broker.maxQueue, maxFrameBytes: shared.configuration.maxFrameBytes)
        self.transport = transport
        self.shared = shared
        self.timers = shared.guardSettings.loopTimers.timers(for: eventLoop)
        self.counters = shared.operations.loopCounters.counters(for: eventLoop)
        self.requestContext = context
    }

    /// The handler joined its pipeline: an open WebSocket counts as an attached client from now on.
    func opened() {
        if machine.transport == .webSocket { attachedType = .websocket }
    }

    private var isPolling: Bool { machine.transport == .polling }
    /// The connection's loop (its timers' `let`: read from any thread).
    var eventLoop: any EventLoop { timers.eventLoop }

    /// The transport while the connection is open or closing; nil once it is closed.
    private var live: (any ConnectionTransport)? {
        if case .closed = machine.state { return nil }
        return transport
    }

    var isOpen: Bool { machine.isOpen }
    /// The current sink (for tests).
    var currentSink: ConnectionSink? { sink }
    /// Whether the WebSocket handler may take the next frame from its parser.
    var takesFrames: Bool { machine.takesFrames }
    /// Whether the connection became an EventSource stream (it stays one while it closes).
    var isStream: Bool { machine.transport == .stream }

    // MARK: Events from the handler

    /// Hands a request's messages to the broker, with this connection's sink offered to its connect.
    /// `context`: the request's.
    func handle(_ elements: [MessageBatch.Element], context: RequestContext) {
        requestContext = context
        // HTTP's pipelining handler keeps the quiesce event to itself: a draining server is seen here.
        if shared.operations.isDraining { perform(machine.quiesce()) }
        guard machine.requestStarted() else { return }
        newSink(persistent: false)
        answer(elements, bytes: 0)
    }

    /// Hands a WebSocket frame's messages (of `bytes` in the frame) to the broker now, or once the frames before it
    /// are answered (`FramesInFlight`).
    func handleFrame(_ elements: [MessageBatch.Element], bytes: Int) {
        let frame = FramesInFlight.Frame(
            elements: elements, bytes: Int32(clamping: bytes), exclusive: !shared.broker.dispatchesAtOnce(elements))
        if let frame = machine.frameArrived(frame) { start(frame) }
    }

    /// A frame goes to the broker: the socket is bound to the client of its first connect, which is offered
    /// the socket's sink.
    private func start(_ frame: FramesInFlight.Frame) {
        if let clientId = Self.connectClientId(frame.elements), clientId != machine.clientId {
            perform(machine.bind(clientId: clientId))
            newSink(persistent: true)
        }
        answer(frame.elements, bytes: frame.bytes)
    }

    private func answer(_ elements: [MessageBatch.Element], bytes: Int32) {
        let (sink, generation, broker, context) = (sink, generation, shared.broker, requestContext)
        switch broker.answer(elements, context: context, sink: sink, now: .now(), on: eventLoop) {
        case .now(let result):
            handled(result, sink: sink, generation: generation, context: context, bytes: bytes)
        case .later(let future):
            future.assumeIsolated().whenComplete { result in
                self.handled(result, sink: sink, generation: generation, context: context, bytes: bytes)
            }
        }
    }

    private func handled(
        _ result: Result<[Outcome], any Error>, sink: ConnectionSink?, generation: UInt32, context: RequestContext,
        bytes: Int32
    ) {
        let broker = shared.broker
        if isPolling {
            guard generation == self.generation else {
                // The connection closed while the broker worked: a connect that attached the sink lets go.
                if case .success(let outcomes) = result, let sink {
                    for case .connect(let pending) in outcomes where pending.result.attached {
                        broker.detach(pending.clientId, sink: sink, takeEvents: false)
                    }
                }
                return
            }
            switch result {
            case .failure(let error):
                perform(machine.requestFailed(error))
            case .success(let outcomes):
                let (replies, events, pending) = broker.split(outcomes, context: context)
                perform(machine.messagesHandled(replies: replies, events: events, pending: pending))
            }
            return
        }
        switch result {
        case .success(let outcomes):
            let (replies, events, pending) = broker.split(outcomes, context: context)
            perform(machine.messagesHandled(replies: replies, events: events, pending: pending))
        case .failure(let error):
            perform(machine.requestFailed(error))
        }
        perform(machine.frameFinished(bytes: bytes))
        live?.batchHandled()
    }

    /// The client of the first connect among `elements`.
    private static func connectClientId(_ elements: [MessageBatch.Element]) -> String? {
        for case .message(let message) in elements where message.channel == Channel.connect {
            return message.clientId
        }
        return nil
    }

    /// A polling connection becomes an EventSource stream of `clientId`, with heartbeats every `pingInterval`.
    func openStream(clientId: String) {
        machine.streamOpened(clientId: clientId, heartbeat: shared.configuration.pingInterval, now: eventLoop.now)
        newSink(persistent: true)
        attachedType = .eventSource
        rearm()
        let (sink, generation) = (sink!, generation)
        shared.broker.attach(clientId, sink: sink, on: eventLoop).assumeIsolated().whenSuccess { attached in
            // An unknown client: the stream ends as if its session had.
            if !attached { self.detached(.disconnected, generation: generation) }
        }
    }

    /// A WebSocket is timed here from now on (pings, silence, blocked writes): the connection guard's state,
    /// handed over as it leaves the pipeline.
    func keepAlive(_ state: ConnectionGuardState) {
        machine.keepAliveHandedOver(state, unsentBytes: live?.unsentBytes ?? 0, now: eventLoop.now)
        rearm()
    }

    /// Bytes arrived: any byte is a sign of life (a later deadline: the armed entry stays as it is).
    func bytesReceived(_ count: Int) {
        machine.bytesReceived(count, now: eventLoop.now)
    }

    func writabilityChanged(isWritable: Bool) {
        let watched = machine.keepAlive.watchesUnsentBytes
        let unsent = watched ? live?.unsentBytes ?? 0 : 0
        perform(machine.writabilityChanged(isWritable: isWritable, unsentBytes: unsent, now: eventLoop.now))
        if watched { rearm() }
    }

    /// Whether the pipeline's read goes on now (it is withheld while writes drain or a frame is handled).
    func readRequested() -> Bool { machine.readRequested() == .read }

    /// The server is draining: a held connect is answered, what waits is sent, persistent connections close.
    func quiesce() { perform(machine.quiesce()) }

    /// The handler writes the close frame or the end of the stream, on its own (a close frame, a protocol error) or
    /// as asked: false when it went out already or the connection is gone.
    func sendingClose() -> Bool { machine.sendingClose() }

    /// The peer closed the connection, or broke the protocol: the close goes out at once.
    func closeNow(_ reason: ConnectionStateMachine.CloseReason) { perform(machine.closeNow(reason)) }

    /// The connection broke the protocol, or failed: counted, logged, and closed at once for `reason`.
    func failed(
        _ reason: ConnectionStateMachine.CloseReason, _ kind: RequestErrorKind, _ message: Logger.Message,
        _ error: (any Error)? = nil, level: Logger.Level = .info
    ) {
        shared.operations.metrics.error(kind)
        var metadata: Logger.Metadata = ["pubsub.remote": "\(requestContext.remoteAddress ?? "?")"]
        if let error { metadata["pubsub.error"] = "\(error)" }
        shared.logger.log(level: level, message, metadata: metadata)
        closeNow(reason)
    }

    func pingReceived(_ payload: ByteBuffer) { perform(machine.pingReceived(payload)) }

    /// Replies to a frame that never reaches the broker.
    func answerAtOnce(_ replies: [Message]) { perform(machine.answeredAtOnce(replies)) }

    /// The close frame or the end of the stream went out: nothing more is written.
    var closeSent: Bool { machine.closeSent }

    /// The connection is gone (or its handler left the pipeline): the transport is not called again.
    func closed() { perform(machine.closed()) }

    // MARK: Events from the sink and the timers

    func deliver(_ events: CircularBuffer<WireEvent>, generation: UInt32) {
        guard generation == self.generation, sink != nil else { return }
        perform(ConnectionStateMachine.Action(machine.eventsDelivered(events, now: eventLoop.now)))
    }

    func detached(_ reason: DetachReason, generation: UInt32) {
        guard generation == self.generation, sink != nil else { return }
        if reason == .overflow, let clientId = machine.clientId {
            shared.broker.logDropped(clientId, transport: attachedType ?? requestContext.connectionType)
        }
        // A persistent sink is attached no more; a polling one is let go with the answer.
        if !isPolling { releaseSink() }
        perform(machine.detached(reason))
    }

    func timerQueueDeadlineReached() {
        let now = eventLoop.now
        if let holdDeadline, now >= holdDeadline {
            self.holdDeadline = nil
            perform(machine.holdTimerFired())
        }
        let unsent = machine.keepAlive.watchesUnsentBytes ? live?.unsentBytes ?? 0 : 0
        let action = machine.keepAliveTimerFired(now: now, unsentBytes: unsent)
        perform(action)
        // Aborted: the connection closes, and its timer entry with it.
        if case .abort = action { return }
        rearm()
    }

    /// Arms the connection's one timer entry for the earliest of its deadlines. A later deadline leaves the entry
    /// as it is: it comes early, finds nothing due and re-arms.
    private func rearm() {
        guard live != nil else { return }
        var next = holdDeadline
        if let deadline = machine.keepAlive.deadline { next = min(next ?? deadline, deadline) }
        guard let next else { return }
        if let armed = timers.deadline(of: self), armed <= next { return }
        timers.schedule(self, at: next)
    }

    // MARK: Actions

    private func perform(_ action: ConnectionStateMachine.Action) {
        switch action {
        case .none:
            break
        case .write(let replies, let events):
            if isPolling { releaseSink() }
            live?.send(replies: replies, events: events)
        case .answer(let answer):
            self.answer(answer)
        case .hold(let hold, let previous, let replies, let events):
            if var previous {
                // One write: the reply it supersedes never goes out ahead of events handed out before it.
                previous.replies.append(contentsOf: replies)
                previous.events.append(contentsOf: events)
                answer(previous)
            } else if !replies.isEmpty || !events.isEmpty {
                live?.send(replies: replies, events: events)
            }
            if isPolling { attachedType = requestContext.connectionType }
            let deadline = eventLoop.now + hold
            holdDeadline = deadline
            rearm()
        case .drained(let events, let resumeReading):
            if !events.isEmpty { live?.send(replies: [], events: events) }
            if resumeReading { live?.resumeReading() }
        case .drop(let clientId):
            drop(clientId)
        case .rebind(let clientId, let answer):
            if let sink { shared.broker.detach(clientId, sink: sink, takeEvents: false) }
            releaseSink()
            if let answer { self.answer(answer) }
        case .close(let reason, let answer, let flush):
            if var answer {
                // What waits goes in the reply's write, before it (a reply never overtakes earlier events).
                var events = flush
                events.append(contentsOf: answer.events)
                answer.events = events
                self.answer(answer)
            } else if !flush.isEmpty {
                live?.send(replies: [], events: flush)
            }
            live?.close(reason)
        case .deliver(let events):
            live?.send(replies: [], events: events)
            noteUnsent()
        case .heartbeat:
            live?.sendHeartbeat()
        case .pong(let payload):
            live?.sendPong(payload)
        case .abort(let reason):
            live?.abort(reason)
        case .fail(let error):
            if isPolling { releaseSink() }
            live?.requestFailed(error)
        case .handle(let frame):
            start(frame)
        case .release(let clientId):
            holdDeadline = nil
            timers.cancel(self)
            if let clientId, let sink { shared.broker.detach(clientId, sink: sink, takeEvents: false) }
            releaseSink()
            attachedType = nil
        }
    }

    /// Sends the reply of the held connect: its hold ended, a delivery or a detach came, it was superseded, or the
    /// server drains. A polling connect lets its sink go with it, and at the hold's end takes what the session holds.
    private func answer(_ answer: ConnectionStateMachine.Answer) {
        holdDeadline = nil
        var events = answer.events
        if isPolling {
            if answer.takeEvents, let sink {
                events.append(contentsOf: shared.broker.detach(answer.connect.clientId, sink: sink, takeEvents: true))
            }
            releaseSink()
        }
        var replies = answer.replies
        var reply = answer.reply
        if answer.failure == nil, !answer.kicked { shared.broker.closeBatch(&reply, for: answer.connect) }
        if let finished = shared.broker.finish(reply, context: requestContext) { replies.append(finished) }
        if isPolling || !replies.isEmpty || !events.isEmpty { live?.send(replies: replies, events: events) }
        if !isPolling { noteUnsent() }
    }

    /// After a WebSocket's write: bytes the socket did not take start the send timeout even while the channel stays
    /// writable (`ConnectionGuardState.writesPending`), so a reader that stopped is closed within `--send-timeout`.
    /// Asked at most every `KeepAlive.unsentCheckEvery`: the channel's option is a dynamic lookup, and a socket that takes
    /// its bytes is the rule. A reader that stops while events go on is still seen within this much; one that stops
    /// after the last event is the ping's to find (`--ping-interval`).
    private func noteUnsent() {
        guard let live else { return }
        let now = eventLoop.now
        guard machine.unsentCheckDue(now: now) else { return }
        let unsent = live.unsentBytes
        guard unsent > 0 else { return }
        machine.unsentWritten(unsent, now: now)
        rearm()
    }

    /// A slow consumer: more than `maxQueue` events wait on a connection that is not writable.
    private func drop(_ clientId: String) {
        let type = attachedType ?? requestContext.connectionType
        releaseSink()
        shared.broker.drop(clientId, transport: type, on: eventLoop)
        live?.close(.overflow)
    }

    private func newSink(persistent: Bool) {
        releaseSink()
        sink = ConnectionSink(driver: self, generation: generation, isPersistent: persistent)
    }

    /// Lets go of the current sink: its calls are no longer wanted (answered, rebound, detached, closed).
    private func releaseSink() {
        guard sink != nil else { return }
        sink = nil
        generation &+= 1
        if machine.transport != .webSocket { attachedType = nil }
    }
}
