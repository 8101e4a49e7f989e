import Bayeux
import NIOCore
import PubSubCore

/// The Bayeux delivery of one connection, whatever carries it: a held `/meta/connect`, the backlog of events
/// that wait while the socket is not writable, the slow-consumer drop, reading paused while writes drain,
/// heartbeats and the drain. Each event returns one action, which the connection's `ConnectionDriver`
/// performs; nothing here touches a channel, so every path is tested without sockets.
///
/// The state is an enum whose cases carry their data, as postgres-nio's machines do:
/// - polling (long-polling, cross-origin, JSON-P): `idle` between requests, `awaiting` while a request that
///   offered a sink is with the broker (what is delivered or detached meanwhile waits there), `parked` while its
///   connect is held (the first delivery, the hold's end or a detach answers it);
/// - `socket`: a WebSocket, bound to the client of its latest connect, with its held connect and the events
///   that wait while it is not writable (up to `maxQueue`, past which the client is dropped);
/// - `stream`: an EventSource stream of one session's events, backlogged and dropped the same way;
/// - `closing` (the close frame or the stream's end about to go out, then gone out: nothing more is written, the
///   sink attached until the connection is gone) and `closed`.
/// Writability, a withheld read, a frame in hand and the drain are the same for every state and kept beside it;
/// so is the keep-alive, a sub-machine (`KeepAlive`: a stream's heartbeats, a WebSocket's pings and timeouts).
/// A transition no connection can take (a second request while one is parked, a frame on a polling connection)
/// stops with a precondition.
struct ConnectionStateMachine {
    /// What the connection is: the one name of its transport in the connection layer (the driver reads it
    /// here; `ConnectionType` is the protocol's name of it on the wire).
    enum Transport: Sendable, Equatable {
        /// Frames in both directions; the connect reply is held on the socket.
        case webSocket
        /// One request, one response (long-polling, cross-origin, JSON-P): a connect is parked until the first
        /// delivery, the end of its hold, or a detach. Such a connection may become an EventSource stream.
        case polling
        /// A polling connection that became an EventSource stream (it stays one while it closes).
        case stream
    }

    /// Why the machine asks for the connection to end.
    enum CloseReason: Sendable, Equatable {
        /// The session ended (`/meta/disconnect`, expiry): WebSocket 1000.
        case normal
        /// The server is draining: WebSocket 1001.
        case goingAway
        /// The client was dropped as a slow consumer: WebSocket 1008.
        case overflow
        /// The peer sent a close frame: its status code goes back (none for none).
        case peerClosed(code: UInt16?)
        /// A frame that breaks the protocol: WebSocket 1002.
        case protocolError
        /// A frame or message over the limit: WebSocket 1009.
        case tooLarge
        /// Text that is not UTF-8, a message that does not inflate: WebSocket 1007.
        case invalidData
    }

    /// The reply of a held connect, to be sent now.
    struct Answer {
        var connect: PendingConnect
        /// Replies that go before the connect reply (the other replies of a parked polling request).
        var replies: [Message]
        var events: CircularBuffer<WireEvent>
        /// When set, the reply fails with this error and tells the client to handshake again.
        var failure: BayeuxError?
        /// Polling: detach the sink first and send the events the session holds as well (a hold that ended).
        var takeEvents: Bool
        /// The session was removed by the server API: the reply fails and tells the client not to reconnect.
        var kicked = false

        /// The connect reply to send (before the outgoing extensions).
        var reply: Message {
            var reply = connect.reply
            if kicked {
                reply.mustNotReconnect(connect.clientId)
            } else if let failure {
                reply.mustHandshake(failure)
            }
            return reply
        }
    }

    /// What to do, in the order its fields are listed.
    enum Action {
        case none
        /// Send replies, then events: one frame, one response, or stream writes.
        case write(replies: [Message], events: CircularBuffer<WireEvent>)
        /// Send the reply of the held connect (after the outgoing extensions).
        case answer(Answer)
        /// A connect is held from now on: answer the one it supersedes (`previous`), send `replies` and `events`
        /// (when there are any), and answer it (`holdTimerFired`) after `hold`.
        case hold(TimeAmount, previous: Answer?, replies: [Message], events: CircularBuffer<WireEvent>)
        /// Writes drained: send what waited (when anything did), then ask for the read withheld (when one was).
        case drained(CircularBuffer<WireEvent>, resumeReading: Bool)
        /// Too many events wait: drop the client (`Broker.drop`: the session ends, its next request is told to
        /// handshake again) and close the connection with `.overflow`.
        case drop(clientId: String)
        /// The socket now carries another client's events: detach the old client's sink, then answer its held
        /// connect (when there was one).
        case rebind(detach: String, answer: Answer?)
        /// End the connection: answer the held connect, send what waits, then close (a WebSocket close frame, the
        /// end of a stream).
        case close(CloseReason, answer: Answer?, flush: CircularBuffer<WireEvent>)
        /// Events delivered to a persistent connection: write them (the send timeout watches whether they go out).
        case deliver(CircularBuffer<WireEvent>)
        /// Write a sign of life: an EventSource comment line, a WebSocket ping.
        case heartbeat
        /// Answer a WebSocket ping with this payload.
        case pong(ByteBuffer)
        /// Close at once, without a goodbye: the keep-alive found the peer silent or not reading.
        case abort(ConnectionGuardState.CloseReason)
        /// The broker failed on a request or frame (its messages are lost): answer it with an error.
        case fail(any Error)
        /// Hand a held frame's messages to the broker: the frames before it are answered.
        case handle(FramesInFlight.Frame)
        /// The connection is gone: the hold ends unanswered, and the sink attached to `detach` lets go.
        case release(detach: String?)
    }

    /// What a delivery means; the one event of the fan-out path, so it allocates nothing.
    enum DeliverAction {
        case none
        case write(CircularBuffer<WireEvent>)
        case answer(Answer)
        /// As `Action.drop`.
        case drop(clientId: String)
    }

    enum ReadAction: Equatable {
        case read
        /// Not writable: the read is remembered and asked for (`.drained`) once writes drain.
        case withhold
    }

    /// What a held connect keeps: its reply's fields and its hold. Not the whole `PendingConnect`, whose engine
    /// result is spent once the connect is held: an idle WebSocket holds one of these for as long as it idles.
    struct HeldConnect {
        var id: JSONValue?
        var clientId: String
        var advice: JSONValue?
        var hold: TimeAmount
        var acknowledges: Bool

        init(_ connect: PendingConnect) {
            (id, clientId, advice, hold) = (connect.id, connect.clientId, connect.advice, connect.hold)
            acknowledges = connect.acknowledges
        }

        /// The connect again, to be answered.
        var connect: PendingConnect {
            PendingConnect(
                id: id, clientId: clientId, advice: advice,
                result: ConnectResult(status: .ok, attached: true, answerNow: false), hold: hold,
                acknowledges: acknowledges)
        }
    }

    struct Parked {
        var connect: HeldConnect
        /// The other replies of the request, sent before the connect's.
        var replies: [Message]
    }

    struct Socket {
        /// The client of the socket's latest connect (nil before the first, or once its session ended).
        var clientId: String?
        var held: HeldConnect?
        var backlog: CircularBuffer<WireEvent>
        /// Events delivered since the held connect came: at `confirmEvery` it is answered, so that the client's
        /// next connect confirms them (`DeliveryLedger`) and the session's unconfirmed events stay few.
        var sinceConnect: Int32 = 0
        /// When a delivery last answered the held connect (`confirmInterval`).
        var answeredAt = NIODeadline.uptimeNanoseconds(0)
        /// The session ended while a frame was handled: the frame's replies go first (the disconnect's own
        /// reply), then the socket closes (`frameFinished`).
        var closeAfterFrame: CloseReason?
    }

    enum State {
        case idle
        case awaiting(backlog: CircularBuffer<WireEvent>, detach: DetachReason?)
        case parked(Parked)
        case socket(Socket)
        case stream(clientId: String, backlog: CircularBuffer<WireEvent>)
        /// Nothing more is taken from the connection; `attached`, the session whose sink lets go when it is gone.
        /// Until `closeSent`, what the close asked for (an answer, what waited) still goes out, then the close
        /// frame or the stream's end; after it, nothing more is written.
        case closing(attached: String?, closeSent: Bool)
        case closed
        /// Only while a transition runs: the state's data is moved out, not copied (no copy on write).
        case modifying
    }

    let maxQueue: Int
    /// A WebSocket's held connect is answered once `confirmEvery` events went out after it (32, or a quarter of
    /// the queue if less) and `confirmInterval` passed since a delivery last answered one, or once `confirmAtMost`
    /// events went out (a quarter of the queue), whichever comes first: so that the client's next connect confirms
    /// them and what a session keeps unconfirmed, and sends again after a fault, stays small at any rate (about
    /// twice the larger bound, within the ledger's `maxQueue`), while a fast stream pays a connect round trip
    /// about once a second, not every 32 events (which cost a fan-out a quarter of its throughput).
    var confirmEvery: Int32 { Int32(clamping: max(1, min(32, maxQueue / 4))) }
    var confirmAtMost: Int32 { Int32(clamping: max(1, maxQueue / 4)) }
    static let confirmInterval = TimeAmount.seconds(1)
    private(set) var state: State
    private(set) var transport: Transport
    private(set) var isWritable = true
    private var readPending = false
    /// WebSocket: the frames whose messages are with the broker, and the one that waits for them. Reading
    /// waits while no frame is taken.
    private(set) var frames: FramesInFlight
    /// Draining: a polling connect is answered as soon as it parks.
    private var quiescing = false
    /// The connection's timing beside the hold.
    private(set) var keepAlive = KeepAlive()

    /// `maxFrameBytes`: what the frames in flight may hold together (`FramesInFlight`).
    init(transport: Transport, maxQueue: Int, maxFrameBytes: Int = 1 << 20) {
        precondition(transport != .stream, "a connection becomes a stream (streamOpened), it does not start as one")
        self.maxQueue = maxQueue
        self.frames = FramesInFlight(maxBytes: maxFrameBytes)
        self.transport = transport
        switch transport {
        case .polling, .stream: state = .idle
        case .webSocket: state = .socket(Socket(clientId: nil, held: nil, backlog: .noEvents))
        }
    }

    var isOpen: Bool {
        switch state {
        case .closing, .closed: false
        default: true
        }
    }

    /// Whether a connect is held (parked, or on the socket).
    var isHolding: Bool {
        switch state {
        case .parked: true
        case .socket(let socket): socket.held != nil
        default: false
        }
    }

    /// The session whose events this connection receives: the socket's client, the stream's, the parked connect's.
    var clientId: String? {
        switch state {
        case .socket(let socket): socket.clientId
        case .stream(let clientId, _): clientId
        case .parked(let parked): parked.connect.clientId
        default: nil
        }
    }

    var isStream: Bool {
        if case .stream = state { return true }
        return false
    }

    /// Events not yet written.
    var backlog: CircularBuffer<WireEvent> {
        switch state {
        case .awaiting(let backlog, _), .stream(_, let backlog): backlog
        case .socket(let socket): socket.backlog
        default: .noEvents
        }
    }

    // MARK: Binding

    /// A WebSocket frame carries a connect for `clientId`: the socket now receives that session's events.
    mutating func bind(clientId: String) -> Action {
        guard case .socket(var socket) = state else {
            precondition(!isOpen, "bind(clientId:) on a connection that is not a WebSocket: \(state)")
            return .none
        }
        guard clientId != socket.clientId else { return .none }
        let old = socket.clientId
        socket.clientId = clientId
        let answer = old == nil ? nil : Self.take(&socket.held)
        state = .socket(socket)
        guard let old else { return .none }
        return .rebind(detach: old, answer: answer)
    }

    /// A polling connection between requests becomes an EventSource stream of `clientId`, with a heartbeat every
    /// `heartbeat` (none when zero).
    mutating func streamOpened(clientId: String, heartbeat: TimeAmount = .zero, now: NIODeadline = .now()) {
        guard case .idle = state else { preconditionFailure("an EventSource stream opened in state \(state)") }
        state = .stream(clientId: clientId, backlog: .noEvents)
        transport = .stream
        if heartbeat > .zero { keepAlive.heartbeatsStarted(every: heartbeat, now: now) }
    }

    // MARK: Messages

    /// Polling: a request is about to be handled with a sink offered to its connect. False when the connection is
    /// already closed (a request pipelined behind the one it closed on, from a client that was killed): there is
    /// no one to answer, and it is not handled.
    mutating func requestStarted() -> Bool {
        switch state {
        case .closing, .closed: return false
        case .idle: break
        default: preconditionFailure("a request started in state \(state)")
        }
        state = .awaiting(backlog: .noEvents, detach: nil)
        return true
    }

    /// The broker failed on a request or frame (its messages are lost): a 500 or an error reply answers it.
    /// Polling: nothing is parked, the next request starts afresh. A socket that is closing answers nothing.
    mutating func requestFailed(_ error: any Error) -> Action {
        switch state {
        case .awaiting:
            state = .idle
            return .fail(error)
        case .socket:
            return .fail(error)
        case .closing, .closed:
            return .none
        case .idle, .parked, .stream, .modifying:
            preconditionFailure("a request failed in state \(state)")
        }
    }

    /// The broker handled the messages of a request or frame: `replies` and `events` go now; `pending`, a
    /// connect whose reply is held (on polling only when its sink was attached).
    mutating func messagesHandled(replies: [Message], events: CircularBuffer<WireEvent>, pending: PendingConnect?)
        -> Action
    {
        switch state {
        case .awaiting(let backlog, let detach):
            guard let pending, pending.result.attached else {
                state = .idle
                return .write(replies: replies, events: events)
            }
            if !backlog.isEmpty || detach != nil {
                state = .idle
                let failure = detach == .overflow ? BayeuxError(.queueOverflow, pending.clientId) : nil
                var answer = Answer(
                    connect: pending, replies: replies, events: backlog, failure: failure, takeEvents: false)
                answer.kicked = detach == .kicked
                return .answer(answer)
            }
            if quiescing {
                state = .idle
                return .answer(
                    Answer(connect: pending, replies: replies, events: .noEvents, failure: nil, takeEvents: true))
            }
            state = .parked(Parked(connect: HeldConnect(pending), replies: replies))
            return .hold(pending.hold, previous: nil, replies: [], events: .noEvents)
        case .socket(var socket):
            state = .modifying
            var previous: Answer?
            if let pending {
                previous = Self.take(&socket.held)
                // The same id as the bound one: keep the engine's copy (one string per client, not one per connect).
                if socket.clientId == pending.clientId { socket.clientId = pending.clientId }
                socket.held = HeldConnect(pending)
                socket.sinceConnect = 0
            }
            var out = CircularBuffer<WireEvent>.noEvents
            if !replies.isEmpty {
                // Replies always go: reading stops while the socket is not writable, so they stay bounded.
                swap(&out, &socket.backlog)
                out.append(contentsOf: events)
            } else if !events.isEmpty {
                switch Self.deliver(events, to: &socket.backlog, isWritable: isWritable, maxQueue: maxQueue) {
                case .write(let events): out = events
                case .drop:
                    if let clientId = socket.clientId {
                        state = .closing(attached: nil, closeSent: false)
                        return .drop(clientId: clientId)
                    }
                case .none, .answer: break
                }
            }
            state = .socket(socket)
            if let pending { return .hold(pending.hold, previous: previous, replies: replies, events: out) }
            if replies.isEmpty, out.isEmpty { return .none }
            return .write(replies: replies, events: out)
        case .closing, .closed:
            return .none
        case .idle, .parked, .stream, .modifying:
            preconditionFailure("messages handled in state \(state)")
        }
    }

    // MARK: Deliveries

    /// The engine delivers events of the attached session.
    mutating func eventsDelivered(_ events: CircularBuffer<WireEvent>, now: NIODeadline = .now()) -> DeliverAction {
        switch state {
        case .parked(let parked):
            state = .idle
            return .answer(
                Answer(
                    connect: parked.connect.connect, replies: parked.replies, events: events, failure: nil,
                    takeEvents: false))
        case .awaiting(var backlog, let detach):
            state = .modifying
            backlog.append(contentsOf: events)
            state = .awaiting(backlog: backlog, detach: detach)
            return .none
        case .socket(var socket):
            state = .modifying
            let action = Self.deliver(events, to: &socket.backlog, isWritable: isWritable, maxQueue: maxQueue)
            if case .drop = action, let clientId = socket.clientId {
                state = .closing(attached: nil, closeSent: false)
                return .drop(clientId: clientId)
            }
            socket.sinceConnect &+= Int32(truncatingIfNeeded: events.count)
            // Written now (the socket keeps up), and enough since the held connect: its reply goes with them.
            if case .write(let out) = action, socket.held != nil,
                socket.sinceConnect >= confirmAtMost
                    || (socket.sinceConnect >= confirmEvery && now - socket.answeredAt >= Self.confirmInterval),
                var answer = Self.take(&socket.held)
            {
                answer.events = out
                socket.sinceConnect = 0
                socket.answeredAt = now
                state = .socket(socket)
                return .answer(answer)
            }
            state = .socket(socket)
            return action
        case .stream(let clientId, var backlog):
            state = .modifying
            let action = Self.deliver(events, to: &backlog, isWritable: isWritable, maxQueue: maxQueue)
            if case .drop = action {
                state = .closing(attached: nil, closeSent: false)
                return .drop(clientId: clientId)
            }
            state = .stream(clientId: clientId, backlog: backlog)
            return action
        case .closing, .closed:
            return .none
        case .idle, .modifying:
            preconditionFailure("events delivered in state \(state): the driver passes only its current sink's")
        }
    }

    /// A persistent connection's delivery: written at once, or kept while not writable; past `maxQueue`, `.drop`
    /// (the caller fills in the client).
    private static func deliver(
        _ events: CircularBuffer<WireEvent>, to backlog: inout CircularBuffer<WireEvent>, isWritable: Bool,
        maxQueue: Int
    ) -> DeliverAction {
        if isWritable, backlog.isEmpty { return .write(events) }
        backlog.append(contentsOf: events)
        if backlog.count > maxQueue {
            backlog = .noEvents
            return .drop(clientId: "")
        }
        guard isWritable else { return .none }
        let all = backlog
        backlog = .noEvents
        return .write(all)
    }

    /// The sink is no longer attached to its session.
    mutating func detached(_ reason: DetachReason) -> Action {
        switch state {
        case .awaiting(let backlog, _):
            state = .awaiting(backlog: backlog, detach: reason)
            return .none
        case .parked(let parked):
            state = .idle
            var answer = Answer(
                connect: parked.connect.connect, replies: parked.replies, events: .noEvents,
                failure: Self.failure(reason, parked.connect.clientId), takeEvents: false)
            answer.kicked = reason == .kicked
            return .answer(answer)
        case .socket(var socket):
            state = .modifying
            let failure = (socket.held?.clientId ?? socket.clientId).flatMap { Self.failure(reason, $0) }
            socket.clientId = nil
            var answer = Self.take(&socket.held)
            answer?.failure = failure
            answer?.kicked = reason == .kicked
            switch reason {
            case .superseded, .overflow:
                state = .socket(socket)
                return answer.map { .answer($0) } ?? .none
            case .disconnected, .kicked, .expired:
                if !frames.isEmpty {
                    // An engine that answers later than it detaches (Redis) would otherwise close the socket
                    // before the reply to the frame's `/meta/disconnect` is written.
                    socket.closeAfterFrame = .normal
                    state = .socket(socket)
                    return answer.map { .answer($0) } ?? .none
                }
                state = .closing(attached: nil, closeSent: false)
                return .close(.normal, answer: answer, flush: .noEvents)
            case .shutdown:
                state = .closing(attached: nil, closeSent: false)
                return .close(.goingAway, answer: answer, flush: socket.backlog)
            }
        case .stream(_, let backlog):
            state = .closing(attached: nil, closeSent: false)
            return .close(reason == .shutdown ? .goingAway : .normal, answer: nil, flush: backlog)
        case .closing, .closed:
            return .none
        case .idle, .modifying:
            preconditionFailure("a detach in state \(state): the driver passes only its current sink's")
        }
    }

    private static func failure(_ reason: DetachReason, _ clientId: String) -> BayeuxError? {
        reason == .overflow ? BayeuxError(.queueOverflow, clientId) : nil
    }

    // MARK: Timers

    /// The hold of the held connect ended.
    mutating func holdTimerFired() -> Action {
        switch state {
        case .parked(let parked):
            state = .idle
            return .answer(
                Answer(
                    connect: parked.connect.connect, replies: parked.replies, events: .noEvents, failure: nil,
                    takeEvents: true))
        case .socket(var socket):
            guard socket.held != nil else { return .none }
            state = .modifying
            var answer = Self.take(&socket.held)
            // What waits goes with the reply, before it: a reply never overtakes events handed out before it.
            if answer != nil { swap(&answer!.events, &socket.backlog) }
            state = .socket(socket)
            return answer.map { .answer($0) } ?? .none
        default:
            return .none
        }
    }

    // MARK: Keep-alive

    /// A WebSocket is timed here from now on (pings, silence, blocked writes): the connection guard's state, handed
    /// over as it leaves the pipeline.
    mutating func keepAliveHandedOver(_ guardState: ConnectionGuardState, unsentBytes: Int, now: NIODeadline) {
        keepAlive.handedOver(guardState, isWritable: isWritable, unsentBytes: unsentBytes, now: now)
    }

    /// Bytes arrived: any byte is a sign of life.
    mutating func bytesReceived(_ count: Int, now: NIODeadline) {
        keepAlive.bytesReceived(count, now: now)
    }

    /// After a write to a WebSocket: whether to look at the channel's unsent bytes now (`unsentWritten`).
    mutating func unsentCheckDue(now: NIODeadline) -> Bool {
        keepAlive.unsentCheckDue(now: now)
    }

    /// Bytes the socket did not take start the send timeout even while the channel stays writable, so that a reader
    /// that stopped is closed within the send timeout (`ConnectionGuardState.writesPending`).
    mutating func unsentWritten(_ unsentBytes: Int, now: NIODeadline) {
        keepAlive.writesPending(unsentBytes: unsentBytes, now: now)
    }

    /// The keep-alive's deadline came (`keepAlive.deadline`). Only an open stream that can take it writes a
    /// heartbeat (a backlog says enough already); an open socket pings.
    mutating func keepAliveTimerFired(now: NIODeadline, unsentBytes: Int = 0) -> Action {
        switch keepAlive.timerFired(now: now, unsentBytes: unsentBytes, isStream: isStream) {
        case .none: return .none
        case .heartbeat: return isStream && isWritable ? .heartbeat : .none
        case .ping: return isOpen ? .heartbeat : .none
        case .abort(let reason): return .abort(reason)
        }
    }

    // MARK: Backpressure

    /// The channel's writability changed (its outbound bytes crossed a water mark). `unsentBytes`: what the
    /// channel holds (read only when `keepAlive.watchesUnsentBytes`).
    mutating func writabilityChanged(isWritable: Bool, unsentBytes: Int = 0, now: NIODeadline = .now()) -> Action {
        self.isWritable = isWritable
        keepAlive.writabilityChanged(isWritable: isWritable, unsentBytes: unsentBytes, now: now)
        guard isWritable else { return .none }
        var events = CircularBuffer<WireEvent>.noEvents
        switch state {
        case .socket(var socket):
            state = .modifying
            swap(&events, &socket.backlog)
            state = .socket(socket)
        case .stream(let clientId, let backlog):
            events = backlog
            state = .stream(clientId: clientId, backlog: .noEvents)
        default:
            break
        }
        let resume = readPending && frames.takesFrames
        if resume { readPending = false }
        if events.isEmpty, !resume { return .none }
        return .drained(events, resumeReading: resume)
    }

    /// The pipeline asks to read more: withheld while writes drain, as NIO's `BackPressureHandler` does, and
    /// while no frame is taken (`FramesInFlight`).
    mutating func readRequested() -> ReadAction {
        if (isWritable && frames.takesFrames) || !isOpen { return .read }
        readPending = true
        return .withhold
    }

    // MARK: Frames in order

    /// Whether the next frame may be taken from the parser.
    var takesFrames: Bool { frames.takesFrames }

    /// A frame was parsed: its messages go to the broker now (returned), or once the frames before it are
    /// answered (`frameFinished` returns it then).
    mutating func frameArrived(_ frame: FramesInFlight.Frame) -> FramesInFlight.Frame? {
        switch state {
        case .socket, .closing, .closed: return frames.arrived(frame)
        default: preconditionFailure("a frame arrived in state \(state)")
        }
    }

    /// The broker answered a frame of `bytes`: the frame held for it goes to the broker, or the next one may be
    /// taken and a read withheld meanwhile is asked for. The last frame of a session that ended closes the socket.
    mutating func frameFinished(bytes: Int32) -> Action {
        frames.finished(bytes: bytes)
        if frames.isEmpty, case .socket(var socket) = state, let reason = socket.closeAfterFrame {
            socket.closeAfterFrame = nil
            frames.dropHeld()
            state = .closing(attached: nil, closeSent: false)
            return .close(reason, answer: nil, flush: socket.backlog)
        }
        // A connection that closes handles nothing more: the frame held for these is dropped with it.
        if !isOpen { frames.dropHeld() }
        if let held = frames.startHeld() { return .handle(held) }
        guard readPending, frames.takesFrames, isWritable || !isOpen else { return .none }
        readPending = false
        return .drained(.noEvents, resumeReading: true)
    }

    // MARK: Ending

    /// The server is draining: a held connect is answered (and any polling connect that parks later), what
    /// waits is sent, persistent connections close.
    mutating func quiesce() -> Action {
        quiescing = true
        switch state {
        case .parked(let parked):
            state = .idle
            return .answer(
                Answer(
                    connect: parked.connect.connect, replies: parked.replies, events: .noEvents, failure: nil,
                    takeEvents: true))
        case .socket(var socket):
            let answer = Self.take(&socket.held)
            state = .closing(attached: socket.clientId, closeSent: false)
            return .close(.goingAway, answer: answer, flush: socket.backlog)
        case .stream(let clientId, let backlog):
            state = .closing(attached: clientId, closeSent: false)
            return .close(.goingAway, answer: nil, flush: backlog)
        case .idle, .awaiting, .closing, .closed, .modifying:
            return .none
        }
    }

    /// The connection ends at once for `reason` (its peer closed it, or broke the protocol): nothing the machine
    /// holds goes out before the close frame; a held connect ends unanswered when the connection goes.
    mutating func closeNow(_ reason: CloseReason) -> Action {
        let attached: String?
        switch state {
        case .socket(let socket): attached = socket.clientId
        case .stream(let clientId, _): attached = clientId
        case .parked(let parked): attached = parked.connect.clientId
        case .idle, .awaiting: attached = nil
        case .closing(let clientId, let closeSent):
            guard !closeSent else { return .none }
            attached = clientId
        case .closed, .modifying: return .none
        }
        state = .closing(attached: attached, closeSent: false)
        return .close(reason, answer: nil, flush: .noEvents)
    }

    /// A WebSocket ping: a pong with its payload, unless the close went out.
    func pingReceived(_ payload: ByteBuffer) -> Action {
        closeSent ? .none : .pong(payload)
    }

    /// A frame answered without the broker (not JSON, not Bayeux, an empty batch): its replies, at once, unless
    /// the close went out. Only publishes of earlier frames may still be with the broker: their replies may
    /// come after this one, as a Bayeux client matches replies by their `id`.
    func answeredAtOnce(_ replies: [Message]) -> Action {
        closeSent ? .none : .write(replies: replies, events: .noEvents)
    }

    /// The handler writes the close frame or the end of the stream, because a `.close` asked. False when it went out already or the connection is gone: nothing more
    /// is written. The socket's or stream's session stays attached until `closed()`.
    mutating func sendingClose() -> Bool {
        switch state {
        case .socket(let socket): state = .closing(attached: socket.clientId, closeSent: true)
        case .stream(let clientId, _): state = .closing(attached: clientId, closeSent: true)
        case .closing(let attached, let closeSent):
            guard !closeSent else { return false }
            state = .closing(attached: attached, closeSent: true)
        case .closed: return false
        case .idle, .awaiting, .parked, .modifying: break
        }
        return true
    }

    /// The close frame or the end of the stream went out (or the connection is gone): nothing more is written.
    var closeSent: Bool {
        switch state {
        case .closing(_, let closeSent): closeSent
        case .closed: true
        default: false
        }
    }

    /// The connection is gone: the hold ends, and the sink lets go of its session.
    mutating func closed() -> Action {
        let previous = state
        state = .closed
        keepAlive.stop()
        switch previous {
        case .parked(let parked): return .release(detach: parked.connect.clientId)
        case .socket(let socket): return .release(detach: socket.clientId)
        case .stream(let clientId, _): return .release(detach: clientId)
        case .closing(let attached, _): return .release(detach: attached)
        case .closed: return .none
        case .idle, .awaiting, .modifying: return .release(detach: nil)
        }
    }

    private static func take(_ held: inout HeldConnect?) -> Answer? {
        guard let connect = held?.connect else { return nil }
        held = nil
        return Answer(connect: connect, replies: [], events: .noEvents, failure: nil, takeEvents: false)
    }
}

extension ConnectionStateMachine.Action {
    /// What a delivery asks for, performed with every other action.
    init(_ delivery: ConnectionStateMachine.DeliverAction) {
        switch delivery {
        case .none: self = .none
        case .write(let events): self = .deliver(events)
        case .answer(let answer): self = .answer(answer)
        case .drop(let clientId): self = .drop(clientId: clientId)
        }
    }
}
