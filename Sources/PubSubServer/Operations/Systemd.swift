import CSystemd
import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The daemon side of systemd, through libsystemd: readiness and status notifications, the watchdog, and
/// sockets handed over by socket activation. Every call is a no-op when the process was not started by
/// systemd (no `NOTIFY_SOCKET`, no `WATCHDOG_USEC`, no `LISTEN_FDS`), so nothing needs to know whether it is.
public struct Systemd: Sendable {
    /// Whether `NOTIFY_SOCKET` is set: only then does `notify` send anything.
    public let isNotifying: Bool

    public init() {
        self.isNotifying = getenv("NOTIFY_SOCKET") != nil
    }

    init(notifying: Bool) {
        self.isNotifying = notifying
    }

    /// Sends one or more `KEY=value` lines (`READY=1`, `STATUS=…`, `STOPPING=1`, `WATCHDOG=1`).
    /// Returns whether the message was sent.
    @discardableResult
    public func notify(_ state: String) -> Bool {
        guard isNotifying else { return false }
        return sd_notify(0, state) > 0
    }

    /// The interval at which systemd expects `WATCHDOG=1` (`WATCHDOG_USEC`, only when `WATCHDOG_PID` is unset or
    /// names this process); nil when the unit has no `WatchdogSec=`.
    public func watchdogInterval() -> TimeAmount? {
        var usec: UInt64 = 0
        guard isNotifying, sd_watchdog_enabled(0, &usec) > 0, usec > 0 else { return nil }
        return .microseconds(Int64(clamping: usec))
    }

    /// A listening socket passed by systemd (`pubsub.socket`), with its `FileDescriptorName=`.
    public struct InheritedSocket: Sendable, Equatable {
        public var descriptor: CInt
        public var name: String
    }

    /// Takes the sockets systemd passed (`LISTEN_FDS` starting at fd 3, for this pid only) and clears the
    /// `LISTEN_*` variables so that child processes do not see them. Descriptors that are not listening stream
    /// sockets are closed and reported in `rejected`.
    public static func takeInheritedSockets() -> (sockets: [InheritedSocket], rejected: [CInt]) {
        var names: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        let count = sd_listen_fds_with_names(1, &names)
        guard count > 0 else { return ([], []) }
        defer {
            if let names {
                for i in 0..<Int(count) { free(names[i]) }
                free(names)
            }
        }
        var sockets: [InheritedSocket] = []
        var rejected: [CInt] = []
        for i in 0..<count {
            let fd = SD_LISTEN_FDS_START + i
            let name = names.flatMap { $0[Int(i)] }.map { String(cString: $0) } ?? "unknown"
            if sd_is_socket(fd, AF_UNSPEC, CInt(SOCK_STREAM_VALUE), 1) > 0 {
                sockets.append(InheritedSocket(descriptor: fd, name: name))
            } else {
                close(fd)
                rejected.append(fd)
            }
        }
        return (sockets, rejected)
    }
}

#if canImport(Glibc)
    private let SOCK_STREAM_VALUE = Int32(SOCK_STREAM.rawValue)
#else
    private let SOCK_STREAM_VALUE = SOCK_STREAM
#endif
