import Logging
import NIOCore

/// What one connection may do over time, as a pure state machine: the header, idle and send timeouts, the
/// WebSocket keep-alive pings, and the lingering close. Events go in with the time they happen (`now:`);
/// what to do comes out as an action; `deadline` is when `timerFired(now:)` is next due. No NIO types are
/// kept but time values, so every path is tested without sockets (`ConnectionGuardStateTests`).
///
/// The phases of a connection:
/// - `waiting`: no request in flight and no byte of the next one. Closed at the deadline: the connection's
///   start plus the header timeout for the first request, the end of the last response plus the idle timeout
///   afterwards; unless bytes of that response are still unsent and draining, then a send timeout later.
/// - `readingHead`: bytes of a request head are arriving; closed at the header deadline unless the head
///   completes first.
/// - `request`: a request is in flight (its response may be parked for a long time: a held `/meta/connect`, an
///   EventSource stream). No timeout but, while its body is still arriving, the idle timeout between reads.
/// - `webSocket`: after an upgrade. Nothing received for `pingInterval`: a ping goes out; nothing received for
///   twice that: closed.
/// - `lingering`: a response was sent and the connection asked to close before the request was read; the
///   output is closed, input is read and dropped within bounds (time in all, time between reads, bytes).
/// In every phase but lingering, writes blocked (channel not writable, nothing of what waits in it gone out) for
/// the send timeout close it.
struct ConnectionGuardState {
    enum Phase: Equatable {
        case waiting(deadline: NIODeadline, firstRequest: Bool, unsent: Int? = nil)
        case readingHead(deadline: NIODeadline)
        case request(bodyComplete: Bool, responded: Bool, lastRead: NIODeadline)
        case webSocket(lastReceived: NIODeadline, pinged: Bool)
        case lingering(until: NIODeadline, lastRead: NIODeadline, bytes: Int)
        case closed
    }

    /// Why the machine closed the connection (for the log).
    enum CloseReason: String, Equatable, Sendable {
        case headerTimeout = "header timeout"
        case idleTimeout = "idle timeout"
        case bodyTimeout = "request body timeout"
        case sendTimeout = "send timeout"
        case pingTimeout = "no answer to pings"
        case lingerDone = "lingering close done"
        case lingerOverflow = "lingering close: too much data"
    }

    /// What to do with bytes just read.
    enum ReadAction: Equatable {
        case forward
        case discard
        case close(CloseReason)
    }

    /// What to do when asked to close the whole connection.
    enum CloseAction: Equatable {
        case closeNow
        /// Close the output, keep reading and dropping until the client closes or a bound is reached.
        case linger
        /// Already lingering (or closed): the close completes when that ends.
        case alreadyClosing
    }

    enum TimerAction: Equatable {
        case none
        case ping
        case close(CloseReason)
    }

    /// Shared by every connection of a server: one reference per connection, not a copy of each setting.
    let settings: ConnectionGuardSettings
    var timeouts: ConnectionTimeouts { settings.timeouts }
    var pingInterval: TimeAmount { settings.pingInterval }
    private(set) var phase: Phase
    /// Since when the channel has not been writable (or last drained some while not writable), if it is not.
    private(set) var blockedSince: NIODeadline?
    /// The bytes waiting in the channel at `blockedSince`: fewer later is progress, a slow reader, not a gone one.
    private var blockedUnsent = 0
    /// Bytes arrived while the response to a request read to its end was awaited: a pipelined request.
    private var bytesWhileAwaitingResponse = false

    init(timeouts: ConnectionTimeouts, pingInterval: TimeAmount, now: NIODeadline) {
        self.init(settings: ConnectionGuardSettings(timeouts: timeouts, pingInterval: pingInterval), now: now)
    }

    init(settings: ConnectionGuardSettings, now: NIODeadline) {
        self.settings = settings
        let timeouts = settings.timeouts
        self.phase = .waiting(deadline: now + timeouts.header, firstRequest: true)
    }

    /// When `timerFired(now:)` is next due; nil when nothing is.
    var deadline: NIODeadline? {
        var phaseDeadline: NIODeadline?
        switch phase {
        case .waiting(let deadline, _, _), .readingHead(let deadline):
            phaseDeadline = deadline
        case .request(let bodyComplete, _, let lastRead):
            phaseDeadline = bodyComplete ? nil : lastRead + timeouts.idle
        case .webSocket(let lastReceived, let pinged):
            phaseDeadline = lastReceived + (pinged ? pingInterval + pingInterval : pingInterval)
        case .lingering(let until, let lastRead, _):
            return min(until, lastRead + timeouts.lingerReadTimeout)
        case .closed:
            return nil
        }
        guard let blockedSince else { return phaseDeadline }
        let sendDeadline = blockedSince + timeouts.send
        return phaseDeadline.map { min($0, sendDeadline) } ?? sendDeadline
    }

    /// Whether the socket is read on while the response to a request read to its end is awaited (a parked
    /// `/meta/connect`). The pipelining handler holds reads back then (one request in flight), which turns the
    /// socket's read interest off and on again for every long-poll: two `epoll_ctl` calls each. Reading on costs
    /// nothing while the client sends nothing, and the first bytes that arrive meanwhile stop it, so what is read
    /// ahead stays one read's worth, as without it; not while writes are blocked either (reading waits for them).
    var readsOnWhileAwaitingResponse: Bool {
        guard case .request(bodyComplete: true, responded: false, _) = phase else { return false }
        return !bytesWhileAwaitingResponse && blockedSince == nil
    }

    var isLingering: Bool {
        if case .lingering = phase { return true }
        return false
    }

    // MARK: Events

    mutating func bytesReceived(_ count: Int, now: NIODeadline) -> ReadAction {
        switch phase {
        case .waiting(let deadline, let firstRequest, _):
            // The first request's head is timed from the connection's start, a later one from its first byte.
            phase = .readingHead(deadline: firstRequest ? deadline : now + timeouts.header)
            return .forward
        case .readingHead:
            return .forward
        case .request(let bodyComplete, let responded, _):
            if bodyComplete && !responded { bytesWhileAwaitingResponse = true }
            phase = .request(bodyComplete: bodyComplete, responded: responded, lastRead: now)
            return .forward
        case .webSocket:
            phase = .webSocket(lastReceived: now, pinged: false)
            return .forward
        case .lingering(let until, _, let bytes):
            let total = bytes + count
            if total > timeouts.lingerBytes {
                phase = .closed
                return .close(.lingerOverflow)
            }
            phase = .lingering(until: until, lastRead: now, bytes: total)
            return .discard
        case .closed:
            return .discard
        }
    }

    /// A request head has been decoded.
    mutating func requestHead(now: NIODeadline) {
        switch phase {
        case .waiting, .readingHead, .request:
            phase = .request(bodyComplete: false, responded: false, lastRead: now)
        case .webSocket, .lingering, .closed:
            break
        }
    }

    /// The request's end has been decoded: its body is read.
    mutating func requestEnd(now: NIODeadline) {
        guard case .request(_, let responded, let lastRead) = phase else { return }
        phase =
            responded
            ? Self.idle(now: now, timeouts) : .request(bodyComplete: true, responded: false, lastRead: lastRead)
    }

    /// The response's end has been sent (its write completed): the connection is idle from now on.
    mutating func responseEnd(now: NIODeadline) {
        guard case .request(let bodyComplete, _, let lastRead) = phase else { return }
        bytesWhileAwaitingResponse = false
        phase =
            bodyComplete
            ? Self.idle(now: now, timeouts) : .request(bodyComplete: false, responded: true, lastRead: lastRead)
    }

    /// The connection is a WebSocket now.
    mutating func upgraded(now: NIODeadline) {
        switch phase {
        case .lingering, .closed: break
        default: phase = .webSocket(lastReceived: now, pinged: false)
        }
    }

    /// `unsentBytes`: what the channel holds, not yet taken by the socket.
    mutating func writabilityChanged(isWritable: Bool, unsentBytes: Int = 0, now: NIODeadline) {
        if isWritable {
            blockedSince = nil
        } else if blockedSince == nil {
            blockedSince = now
            blockedUnsent = unsentBytes
        }
    }

    /// A write left bytes in the channel that the socket did not take while the channel stays writable: a reader
    /// that stopped, under the write buffer's water mark (the kernel's send buffer is bounded, so it soon fills).
    /// The send timeout applies to them as to a blocked channel.
    mutating func writesPending(unsentBytes: Int, now: NIODeadline) {
        guard blockedSince == nil, unsentBytes > 0 else { return }
        blockedSince = now
        blockedUnsent = unsentBytes
    }

    /// Something asks to close the whole connection. Lingers when a request is partly read: bytes of a head
    /// have arrived, or a body has not been read to its end.
    mutating func closeRequested(now: NIODeadline) -> CloseAction {
        switch phase {
        case .readingHead, .request(bodyComplete: false, _, _):
            phase = .lingering(until: now + timeouts.lingerTime, lastRead: now, bytes: 0)
            return .linger
        case .lingering, .closed:
            return .alreadyClosing
        case .waiting, .request, .webSocket:
            phase = .closed
            return .closeNow
        }
    }

    /// The connection is closed (by either side).
    mutating func closed() {
        phase = .closed
        blockedSince = nil
    }

    /// `unsentBytes`: what the channel still holds of responses written (not yet taken by the socket).
    mutating func timerFired(now: NIODeadline, unsentBytes: Int = 0) -> TimerAction {
        if let blockedSince, now >= blockedSince + timeouts.send {
            switch phase {
            case .lingering, .closed:
                break
            default:
                // Not writable (or bytes pending) all along, but some went out: a slow reader gets another send
                // timeout; all of it went out: nothing is pending any more.
                guard unsentBytes < blockedUnsent else {
                    phase = .closed
                    return .close(.sendTimeout)
                }
                self.blockedSince = unsentBytes == 0 ? nil : now
                blockedUnsent = unsentBytes
            }
        }
        switch phase {
        case .waiting(let deadline, let firstRequest, let unsent):
            guard now >= deadline else { return .none }
            // A response still going out: wait a send timeout more each time some of it has gone.
            if unsentBytes > 0, unsent.map({ unsentBytes < $0 }) ?? true {
                phase = .waiting(deadline: now + timeouts.send, firstRequest: firstRequest, unsent: unsentBytes)
                return .none
            }
            phase = .closed
            return .close(unsentBytes > 0 ? .sendTimeout : firstRequest ? .headerTimeout : .idleTimeout)
        case .readingHead(let deadline):
            guard now >= deadline else { return .none }
            phase = .closed
            return .close(.headerTimeout)
        case .request(let bodyComplete, _, let lastRead):
            guard !bodyComplete, now >= lastRead + timeouts.idle else { return .none }
            phase = .closed
            return .close(.bodyTimeout)
        case .webSocket(let lastReceived, let pinged):
            if now >= lastReceived + pingInterval + pingInterval {
                phase = .closed
                return .close(.pingTimeout)
            }
            guard !pinged, now >= lastReceived + pingInterval else { return .none }
            phase = .webSocket(lastReceived: lastReceived, pinged: true)
            return .ping
        case .lingering(let until, let lastRead, _):
            guard now >= until || now >= lastRead + timeouts.lingerReadTimeout else { return .none }
            phase = .closed
            return .close(.lingerDone)
        case .closed:
            return .none
        }
    }

    private static func idle(now: NIODeadline, _ timeouts: ConnectionTimeouts) -> Phase {
        .waiting(deadline: now + timeouts.idle, firstRequest: false)
    }
}

/// The timeouts, ping interval and logger of every connection guard of one server, held once, with the timers
/// of each of its event loops (`loops`; a loop not among them gets timers of its own per connection).
final class ConnectionGuardSettings: Sendable {
    let timeouts: ConnectionTimeouts
    let pingInterval: TimeAmount
    let logger: Logger?
    let loopTimers: LoopTimerTable

    init(timeouts: ConnectionTimeouts, pingInterval: TimeAmount, logger: Logger? = nil, loops: [any EventLoop] = []) {
        self.timeouts = timeouts
        self.pingInterval = pingInterval
        self.logger = logger
        self.loopTimers = LoopTimerTable(loops: loops)
    }
}
