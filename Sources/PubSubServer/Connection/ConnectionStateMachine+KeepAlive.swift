import NIOCore

extension ConnectionStateMachine {
    /// A connection's timing beside the hold, a sub-machine of the connection's (as postgres-nio's
    /// `ConnectionStateMachine` keeps its `ListenStateMachine`): an EventSource stream's heartbeats, or a
    /// WebSocket's keep-alive (pings, silence, blocked writes), which the `ConnectionGuard` hands over as it leaves
    /// the pipeline. One or the other, never both, in the room of the larger. `deadline` is when `timerFired` is
    /// next due; the connection's machine turns what it returns into its own actions.
    struct KeepAlive {
        enum State {
            case none
            /// An EventSource stream's next heartbeat is due at `next`, then every `every`.
            case heartbeat(every: TimeAmount, next: NIODeadline)
            /// A WebSocket's keep-alive, as the connection guard handed it over.
            case webSocket(ConnectionGuardState)
        }

        enum Action: Equatable {
            case none
            /// A stream's heartbeat is due.
            case heartbeat
            /// A WebSocket's ping is due.
            case ping
            /// Close at once, without a goodbye: the peer went silent, or does not read.
            case abort(ConnectionGuardState.CloseReason)
        }

        private(set) var state = State.none
        /// When the last check of the channel's unsent bytes was (`unsentCheckDue`).
        private var unsentCheckedAt = NIODeadline.uptimeNanoseconds(0)

        /// After a WebSocket's write the channel's unsent bytes are looked at no more often than this: the
        /// channel's option is a dynamic lookup, and a socket that takes its bytes is the rule.
        static let unsentCheckEvery = TimeAmount.milliseconds(50)

        /// When `timerFired` is next due; nil when nothing is.
        var deadline: NIODeadline? {
            switch state {
            case .none: nil
            case .heartbeat(_, let next): next
            case .webSocket(let guardState): guardState.deadline
            }
        }

        /// Whether decisions need the channel's unsent bytes (a WebSocket's send timeout); the caller reads them
        /// (a dynamic lookup) only then.
        var watchesUnsentBytes: Bool {
            if case .webSocket = state { return true }
            return false
        }

        /// A stream's heartbeats start: the first one `interval` from now.
        mutating func heartbeatsStarted(every interval: TimeAmount, now: NIODeadline) {
            state = .heartbeat(every: interval, next: now + interval)
        }

        /// A WebSocket is timed here from now on: the connection guard's state, handed over after the upgrade.
        mutating func handedOver(
            _ guardState: ConnectionGuardState, isWritable: Bool, unsentBytes: Int, now: NIODeadline
        ) {
            var guardState = guardState
            guardState.upgraded(now: now)
            guardState.writabilityChanged(isWritable: isWritable, unsentBytes: unsentBytes, now: now)
            state = .webSocket(guardState)
        }

        /// Bytes arrived: any byte is a sign of life (a later deadline).
        mutating func bytesReceived(_ count: Int, now: NIODeadline) {
            guard case .webSocket(var guardState) = state else { return }
            state = .none
            _ = guardState.bytesReceived(count, now: now)
            state = .webSocket(guardState)
        }

        /// The channel's writability changed: blocked writes start the send timeout, and end it.
        mutating func writabilityChanged(isWritable: Bool, unsentBytes: Int, now: NIODeadline) {
            guard case .webSocket(var guardState) = state else { return }
            state = .none
            guardState.writabilityChanged(isWritable: isWritable, unsentBytes: unsentBytes, now: now)
            state = .webSocket(guardState)
        }

        /// After a WebSocket's write: whether to look at the channel's unsent bytes now (not blocked already, and
        /// at most every `unsentCheckEvery`). True counts as a look.
        mutating func unsentCheckDue(now: NIODeadline) -> Bool {
            guard case .webSocket(let guardState) = state, guardState.blockedSince == nil,
                now - unsentCheckedAt >= Self.unsentCheckEvery
            else { return false }
            unsentCheckedAt = now
            return true
        }

        /// Bytes the socket did not take while the channel stays writable start the send timeout.
        mutating func writesPending(unsentBytes: Int, now: NIODeadline) {
            guard unsentBytes > 0, case .webSocket(var guardState) = state else { return }
            state = .none
            guardState.writesPending(unsentBytes: unsentBytes, now: now)
            state = .webSocket(guardState)
        }

        /// The deadline came (or an earlier one: then nothing is due). `isStream`: heartbeats go on only while the
        /// connection is still a stream.
        mutating func timerFired(now: NIODeadline, unsentBytes: Int, isStream: Bool) -> Action {
            switch state {
            case .none:
                return .none
            case .heartbeat(let every, let next):
                guard now >= next else { return .none }
                state = isStream ? .heartbeat(every: every, next: now + every) : .none
                return .heartbeat
            case .webSocket(var guardState):
                state = .none
                let action = guardState.timerFired(now: now, unsentBytes: unsentBytes)
                state = .webSocket(guardState)
                switch action {
                case .none: return .none
                case .ping: return .ping
                case .close(let reason): return .abort(reason)
                }
            }
        }

        /// The connection is gone: nothing more is timed.
        mutating func stop() {
            state = .none
        }
    }
}
