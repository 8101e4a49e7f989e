import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The daemon side of systemd, through libsystemd: readiness and status notifications, the watchdog, and
/// sockets handed over by socket activation. Every call is a no-op when the process was not started by
/// systemd (no `NOTIFY_SOCKET`, no `WATCHDOG_USEC`, no `LISTEN_FDS`), so nothing needs to know whether it is.
///
/// libsystemd is loaded at run time (`LibSystemd`), so building needs no `libsystemd-dev` and the binary runs
/// where there is no libsystemd; there every call is a no-op too, and `Systemd.library` is nil.
public struct Systemd: Sendable {
    /// Whether `NOTIFY_SOCKET` is set: only then does `notify` send anything.
    public let isNotifying: Bool

    /// libsystemd's daemon functions, loaded once on first use; nil where `libsystemd.so.0` cannot be loaded.
    public static var library: LibSystemd? { LibSystemd.shared }

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
        guard isNotifying, let library = Self.library else { return false }
        return library.notify(0, state) > 0
    }

    /// The interval at which systemd expects `WATCHDOG=1` (`WATCHDOG_USEC`, only when `WATCHDOG_PID` is unset or
    /// names this process); nil when the unit has no `WatchdogSec=`.
    public func watchdogInterval() -> TimeAmount? {
        var usec: UInt64 = 0
        guard isNotifying, let library = Self.library, library.watchdogEnabled(0, &usec) > 0, usec > 0 else {
            return nil
        }
        return .microseconds(Int64(clamping: usec))
    }

    /// A listening socket passed by systemd (`pubsub.socket`), with its `FileDescriptorName=`.
    public struct InheritedSocket: Sendable, Equatable {
        public var descriptor: CInt
        public var name: String
    }

    /// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
    static let listenFDsStart: CInt = 3

    /// Takes the sockets systemd passed (`LISTEN_FDS` starting at fd 3, for this pid only) and clears the
    /// `LISTEN_*` variables so that child processes do not see them. Descriptors that are not listening stream
    /// sockets are closed and reported in `rejected`.
    public static func takeInheritedSockets() -> (sockets: [InheritedSocket], rejected: [CInt]) {
        guard let library else { return ([], []) }
        var names: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        let count = library.listenFDsWithNames(1, &names)
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
            let fd = listenFDsStart + i
            let name = names.flatMap { $0[Int(i)] }.map { String(cString: $0) } ?? "unknown"
            if library.isSocket(fd, AF_UNSPEC, CInt(SOCK_STREAM_VALUE), 1) > 0 {
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
