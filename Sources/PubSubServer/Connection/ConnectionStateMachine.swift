import Bayeux
import NIOCore
import PubSubCore

/// The Bayeux delivery of one connection, whatever carries it: a held `/meta/connect`, the backlog of events
/// that wait while the socket is not writable, the slow-consumer drop, reading paused while writes drain,
/// heartbeats and the drain. WebSocket, long-polling, callback-polling and EventSource handlers decode, feed
/// it events and perform the actions it returns; nothing here touches a channel, so every path is tested
/// without sockets.
///
/// Transports differ in two ways only: a polling connection answers a held connect with the first delivery
/// (its sink is one-shot, the engine queues what follows), and a persistent one (WebSocket, EventSource) keeps
/// receiving, so what it cannot write waits here, up to `maxQueue` events, and past that the client is dropped.
struct ConnectionStateMachine {
    enum Transport: Sendable, Equatable {
        /// Frames in both directions; the connect reply is held on the socket.
        case webSocket
        /// One request, one response (long-polling, cross-origin, JSON-P): a connect is parked until the first
        /// delivery, the end of its hold, or a detach.
        case polling
        /// An open stream that only carries events (its connects come by polling without a hold).
        case eventSource
    }

    /// Why the machine asks for the connection to end.
    enum CloseReason: Sendable, Equatable {
        /// The session ended (`/meta/disconnect`, expiry): WebSocket 1000.
        case normal
        /// The server is draining: WebSocket 1001.
        case goingAway
        /// The client was dropped as a slow consumer: WebSocket 1008.
        case overflow
    }

    /// The reply of a held connect, to be sent now.
    struct Answer {
        var connect: PendingConnect
        /// Replies that go before the connect reply (the other replies of a parked polling request).
        var replies: [Message]
        var events: CircularBuffer<ByteBuffer>
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

    enum Action {
        /// Send replies, then events: one frame, one response, or stream writes.
        case write(replies: [Message], events: CircularBuffer<ByteBuffer>)
        /// Send the reply of the held connect (after the outgoing extensions); cancels its hold timer.
        case answer(Answer)
        /// A connect is held: answer it (`holdTimerFired`) after this long.
        case armHoldTimer(TimeAmount)
        /// The held connect went away unanswered (the connection closed).
        case cancelHoldTimer
        /// Reading was withheld while writes drained: ask for the read now.
        case resumeReading
        /// Too many events wait: drop the client (`Broker.drop`: the session ends, its next request is told to
        /// handshake again) and close the connection with `.overflow`.
        case drop(clientId: String)
        /// The sink of this session must stop receiving (its waiting events stay queued for the next connection).
        case detach(clientId: String)
        /// End the connection (a WebSocket close frame, the end of a stream).
        case close(CloseReason)
        /// Write a heartbeat (an EventSource comment line).
        case heartbeat
    }

    /// What a delivery means; the one event of the fan-out path, so it allocates nothing and returns one action.
    enum DeliverAction {
        case none
        case write(CircularBuffer<ByteBuffer>)
        case answer(Answer)
        /// As `Action.drop`.
        case drop(clientId: String)
    }

    enum ReadAction: Equatable {
        case read
        /// Not writable: the read is remembered and asked for (`.resumeReading`) once writes drain.
        case withhold
    }

    private enum Phase: Equatable {
        case open
        /// Closing (a close frame sent, a stream ended): nothing more is written.
        case closing
        case closed
    }

    private struct Held {
        var connect: PendingConnect
        var replies: [Message]
    }

    private(set) var transport: Transport
    let maxQueue: Int
    private var phase = Phase.open
    /// The session whose events this connection receives (WebSocket bound by a connect, an EventSource stream).
    private(set) var clientId: String?
    private var held: Held?
    /// Polling: the broker is handling a request that offered a sink; what arrives before it parks waits here.
    private var awaiting = false
    private var earlyDetach: DetachReason?
    /// Events not yet written (persistent transports while not writable; polling: delivered before parking).
    private(set) var backlog = CircularBuffer<ByteBuffer>.noEvents
    private(set) var isWritable = true
    private var readPending = false
    /// WebSocket: the messages of a frame are with the broker. The next frame waits for them, and so does
    /// reading: a client's publishes reach the engine in the order it sent them, whatever the engine's latency
    /// (a Redis round trip), and what waits is at most one read's worth of bytes in the frame parser.
    private(set) var isHandlingFrame = false
    /// A WebSocket session ended (its own `/meta/disconnect`, a kick, an expiry) while a frame was handled: the
    /// frame's replies go out first (the disconnect's own reply), then the socket closes (`frameFinished`).
    private var closeAfterFrame: CloseReason?
    /// Draining: a polling connect is answered as soon as it parks.
    private var quiescing = false

    init(transport: Transport, maxQueue: Int) {
        self.transport = transport
        self.maxQueue = maxQueue
    }

    var isHolding: Bool { held != nil }
    /// The client of the held connect.
    var heldClientId: String? { held?.connect.clientId }
    var isOpen: Bool { phase == .open }
    var isStreaming: Bool { transport == .eventSource && clientId != nil }

    // MARK: Binding

    /// A WebSocket frame carries a connect for `clientId`: the socket now receives that session's events.
    /// A connect of an earlier client bound to the socket is answered, and its sink detached.
    mutating func bind(clientId: String) -> [Action] {
        guard clientId != self.clientId else { return [] }
        var actions: [Action] = []
        if let old = self.clientId {
            actions.append(.detach(clientId: old))
            if let answer = takeHeld(failure: nil, takeEvents: false) { actions.append(.answer(answer)) }
        }
        self.clientId = clientId
        return actions
    }

    /// A polling connection becomes an EventSource stream of `clientId`.
    mutating func streamOpened(clientId: String) {
        transport = .eventSource
        self.clientId = clientId
    }

    // MARK: Messages

    /// Polling: a request is about to be handled with a sink offered to its connect.
    mutating func requestStarted() {
        awaiting = true
        earlyDetach = nil
        backlog.removeAll(keepingCapacity: true)
    }

    /// The broker handled the messages of a request or frame: `replies` and `events` go now; `pending`, a
    /// connect whose reply is held (on polling only when its sink was attached).
    mutating func messagesHandled(replies: [Message], events: CircularBuffer<ByteBuffer>, pending: PendingConnect?)
        -> [Action]
    {
        guard phase == .open else { return [] }
        switch transport {
        case .polling:
            awaiting = false
            guard let pending, pending.result.attached else {
                backlog = .noEvents
                return [.write(replies: replies, events: events)]
            }
            held = Held(connect: pending, replies: replies)
            if !backlog.isEmpty || earlyDetach != nil {
                let failure = earlyDetach == .overflow ? BayeuxError(.queueOverflow, pending.clientId) : nil
                var answer = takeHeld(failure: failure, takeEvents: false)!
                answer.kicked = earlyDetach == .kicked
                earlyDetach = nil
                return [.answer(answer)]
            }
            if quiescing { return [.answer(takeHeld(failure: nil, takeEvents: true)!)] }
            return [.armHoldTimer(pending.hold)]
        case .webSocket, .eventSource:
            var actions: [Action] = []
            if let pending {
                // The same id as the bound one: keep the engine's copy (one string per client, not one per connect).
                if clientId == pending.clientId { clientId = pending.clientId }
                if let previous = takeHeld(failure: nil, takeEvents: false) { actions.append(.answer(previous)) }
                held = Held(connect: pending, replies: [])
                actions.append(.armHoldTimer(pending.hold))
            }
            if !replies.isEmpty {
                // Replies always go: reading stops while the socket is not writable, so they stay bounded.
                var all = backlog
                backlog = .noEvents
                all.append(contentsOf: events)
                actions.append(.write(replies: replies, events: all))
            } else if !events.isEmpty {
                switch eventsDelivered(events) {
                case .write(let events): actions.append(.write(replies: [], events: events))
                case .drop(let clientId): actions.append(.drop(clientId: clientId))
                case .none, .answer: break
                }
            }
            return actions
        }
    }

    // MARK: Deliveries

    /// The engine delivers events of the attached session.
    mutating func eventsDelivered(_ events: CircularBuffer<ByteBuffer>) -> DeliverAction {
        guard phase == .open else { return .none }
        switch transport {
        case .polling:
            if held != nil {
                var answer = takeHeld(failure: nil, takeEvents: false)!
                answer.events = events
                return .answer(answer)
            }
            if awaiting { backlog.append(contentsOf: events) }
            return .none
        case .webSocket, .eventSource:
            if isWritable, backlog.isEmpty { return .write(events) }
            backlog.append(contentsOf: events)
            if backlog.count > maxQueue, let clientId {
                phase = .closing
                backlog = .noEvents
                self.clientId = nil
                return .drop(clientId: clientId)
            }
            if isWritable {
                let all = backlog
                backlog = .noEvents
                return .write(all)
            }
            return .none
        }
    }

    /// The sink is no longer attached to its session.
    mutating func detached(_ reason: DetachReason) -> [Action] {
        guard phase == .open else { return [] }
        let failure = reason == .overflow ? clientIdForFailure().map { BayeuxError(.queueOverflow, $0) } : nil
        switch transport {
        case .polling:
            if var answer = takeHeld(failure: failure, takeEvents: false) {
                answer.kicked = reason == .kicked
                return [.answer(answer)]
            }
            if awaiting { earlyDetach = reason }
            return []
        case .webSocket:
            clientId = nil
            var actions: [Action] = []
            if var answer = takeHeld(failure: failure, takeEvents: false) {
                answer.kicked = reason == .kicked
                actions.append(.answer(answer))
            }
            switch reason {
            case .superseded, .overflow: break
            case .disconnected, .kicked, .expired:
                if isHandlingFrame {
                    // An engine that answers later than it detaches (Redis) would otherwise close the socket
                    // before the reply to the frame's `/meta/disconnect` is written.
                    closeAfterFrame = .normal
                } else {
                    phase = .closing
                    actions.append(.close(.normal))
                }
            case .shutdown:
                actions.append(contentsOf: closeFlushing(.goingAway))
            }
            return actions
        case .eventSource:
            clientId = nil
            return closeFlushing(reason == .shutdown ? .goingAway : .normal)
        }
    }

    private func clientIdForFailure() -> String? { held?.connect.clientId ?? clientId }

    // MARK: Timers

    /// The hold of the held connect ended.
    mutating func holdTimerFired() -> [Action] {
        guard phase == .open, let answer = takeHeld(failure: nil, takeEvents: transport == .polling) else { return [] }
        return [.answer(answer)]
    }

    /// Time for a heartbeat: only an open stream that can take it writes one (a backlog says enough already).
    mutating func heartbeatDue() -> [Action] {
        guard phase == .open, isStreaming, isWritable else { return [] }
        return [.heartbeat]
    }

    // MARK: Backpressure

    /// The channel's writability changed (its outbound bytes crossed a water mark).
    mutating func writabilityChanged(isWritable: Bool) -> [Action] {
        self.isWritable = isWritable
        guard isWritable else { return [] }
        var actions: [Action] = []
        if phase == .open, transport != .polling, !backlog.isEmpty {
            let events = backlog
            backlog = .noEvents
            actions.append(.write(replies: [], events: events))
        }
        if readPending, !isHandlingFrame {
            readPending = false
            actions.append(.resumeReading)
        }
        return actions
    }

    /// The pipeline asks to read more: withheld while writes drain, as NIO's `BackPressureHandler` does, and
    /// while a frame is handled.
    mutating func readRequested() -> ReadAction {
        if (isWritable && !isHandlingFrame) || phase != .open { return .read }
        readPending = true
        return .withhold
    }

    // MARK: Frames in order

    /// A frame's messages go to the broker: no other frame is taken until `frameFinished`.
    mutating func frameStarted() {
        isHandlingFrame = true
    }

    /// The broker handled the frame: the next one may be taken, and a read withheld meanwhile is asked for.
    mutating func frameFinished() -> [Action] {
        isHandlingFrame = false
        if let reason = closeAfterFrame {
            closeAfterFrame = nil
            if phase == .open { return closeFlushing(reason) }
        }
        guard readPending, isWritable || phase != .open else { return [] }
        readPending = false
        return [.resumeReading]
    }

    // MARK: Ending

    /// The server is draining: a held connect is answered, what waits is sent, persistent connections close.
    mutating func quiesce() -> [Action] {
        quiescing = true
        guard phase == .open else { return [] }
        switch transport {
        case .polling:
            if let answer = takeHeld(failure: nil, takeEvents: true) { return [.answer(answer)] }
            return []
        case .webSocket, .eventSource:
            var actions: [Action] = []
            if let answer = takeHeld(failure: nil, takeEvents: false) { actions.append(.answer(answer)) }
            actions.append(contentsOf: closeFlushing(.goingAway))
            return actions
        }
    }

    /// The handler closes the connection on its own (a close frame received, a protocol error).
    mutating func closing() {
        if phase == .open { phase = .closing }
    }

    /// The connection is gone: the sink is detached, the hold timer cancelled.
    mutating func closed() -> [Action] {
        guard phase != .closed else { return [] }
        phase = .closed
        var actions: [Action] = []
        if let held {
            self.held = nil
            actions.append(.cancelHoldTimer)
            if transport == .polling { actions.append(.detach(clientId: held.connect.clientId)) }
        }
        if let clientId {
            self.clientId = nil
            actions.append(.detach(clientId: clientId))
        }
        backlog = .noEvents
        return actions
    }

    private mutating func closeFlushing(_ reason: CloseReason) -> [Action] {
        phase = .closing
        var actions: [Action] = []
        if !backlog.isEmpty {
            actions.append(.write(replies: [], events: backlog))
            backlog = .noEvents
        }
        actions.append(.close(reason))
        return actions
    }

    private mutating func takeHeld(failure: BayeuxError?, takeEvents: Bool) -> Answer? {
        guard let held else { return nil }
        self.held = nil
        var events = CircularBuffer<ByteBuffer>.noEvents
        if transport == .polling {
            swap(&events, &backlog)
        }
        return Answer(
            connect: held.connect, replies: held.replies, events: events, failure: failure, takeEvents: takeEvents)
    }
}
