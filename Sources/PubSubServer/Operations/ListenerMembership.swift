#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Whether this process listens on a port it shares with others (`--reuse-port`): the kernel spreads new
/// connections over every socket listening on the port, blind to how full each process is. A process near its
/// `--max-connections` leaves the port's group (closes its listener), so that new clients reach the others
/// instead of being refused here while they have room; it joins again (binds a new listener) once enough of its
/// connections closed. Without `--reuse-port` or without a limit it always listens, and a client over the limit
/// is answered 503 as before.
///
/// It leaves at `leaveAt` open connections, a little under the limit (room for those the kernel had already
/// queued on the listener when it closed), and joins again at `rejoinAt`, lower still, so that a process at the
/// edge does not leave and join on every connection. Events in, actions out: `ServerOperations` feeds it under
/// its connection lock, `PubSubServer` closes and binds.
struct ListenerMembership: Sendable, Equatable {
    enum Phase: Sendable, Equatable {
        /// Listening on the shared port.
        case member
        /// Asked to close its listener; not closed yet.
        case leaving
        /// Not listening: the other processes on the port get the new connections.
        case away
        /// Asked to bind a listener again; not bound yet.
        case joining
        /// Draining or stopped: never joins again.
        case stopped
    }

    enum Action: Sendable, Equatable {
        case none
        case leave
        case join
    }

    let leaveAt: Int
    let rejoinAt: Int
    private(set) var phase = Phase.member

    /// Nil when the process always listens: no shared port, or no connection limit.
    init?(limit: Int, sharedPort: Bool) {
        guard sharedPort, limit > 0 else { return nil }
        let margin = max(1, limit / 64)
        leaveAt = max(1, limit - margin)
        rejoinAt = max(0, leaveAt - margin)
    }

    /// A connection was admitted; `open` are open now.
    mutating func opened(open: Int) -> Action {
        guard phase == .member, open >= leaveAt else { return .none }
        phase = .leaving
        return .leave
    }

    /// A connection closed; `open` are open now.
    mutating func closed(open: Int) -> Action {
        guard phase == .away, open <= rejoinAt else { return .none }
        phase = .joining
        return .join
    }

    /// The listener is closed; `open` connections are open now (some may have closed meanwhile).
    mutating func left(open: Int) -> Action {
        guard phase == .leaving else { return .none }
        phase = .away
        return closed(open: open)
    }

    /// A new listener is bound (`bound`), or binding failed: then it stays away and tries again at the next close.
    mutating func joined(bound: Bool, open: Int) -> Action {
        guard phase == .joining else { return .none }
        guard bound else {
            phase = .away
            return .none
        }
        phase = .member
        return opened(open: open)
    }

    /// Draining: whatever closes from now on, it does not join again.
    mutating func stop() {
        phase = .stopped
    }

    /// Whether Linux hands the connections still queued on a listener that closes to another listener of the
    /// port (`net.ipv4.tcp_migrate_req`, Linux 5.14); else it resets them. Nil when it cannot tell.
    static func kernelMigratesQueuedConnections() -> Bool? {
        #if canImport(Glibc) || canImport(Musl)
            guard let file = fopen("/proc/sys/net/ipv4/tcp_migrate_req", "r") else { return nil }
            defer { fclose(file) }
            let first = fgetc(file)
            guard first >= CInt(UInt8(ascii: "0")), first <= CInt(UInt8(ascii: "9")) else { return nil }
            return first != CInt(UInt8(ascii: "0"))
        #else
            return nil
        #endif
    }
}
