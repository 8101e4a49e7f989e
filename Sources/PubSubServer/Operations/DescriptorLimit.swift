#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The process's file descriptor limit (`RLIMIT_NOFILE`): every connection, listener, Redis or PostgreSQL
/// connection, webhook request and open file takes one descriptor.
public struct DescriptorLimit: Sendable, Equatable {
    /// The limit in force (`Int.max`: unlimited).
    public var soft: Int
    /// What the soft limit may be raised to without privileges (`Int.max`: unlimited).
    public var hard: Int

    public init(soft: Int, hard: Int) {
        self.soft = soft
        self.hard = hard
    }

    /// Descriptors kept for everything that is not a client connection when `--max-connections` is derived
    /// from the limit: `max(64, limit / 20)`, but at most half the limit (so a tiny limit still serves some).
    public static func headroom(soft: Int) -> Int {
        min(soft / 2, max(64, soft / 20))
    }

    /// The default of `--max-connections`: the soft limit less `headroom(soft:)`; 0 (no limit) when the soft
    /// limit is unlimited. With 1024: 960; with 20000: 19000; with 1048576: 996148; with 64: 32.
    public static func defaultMaxConnections(soft: Int) -> Int {
        guard soft != Int.max else { return 0 }
        return max(1, soft - headroom(soft: soft))
    }

    public var defaultMaxConnections: Int { Self.defaultMaxConnections(soft: soft) }

    /// Whether `maxConnections` (0: no limit) can be open at once under this limit, with its headroom.
    public func allows(maxConnections: Int) -> Bool {
        guard soft != Int.max else { return true }
        return maxConnections > 0 && maxConnections <= defaultMaxConnections
    }

    /// The soft limit the process should raise to: the hard limit, or, when that is unlimited, the kernel's
    /// ceiling for one process (`nrOpen`, /proc/sys/fs/nr_open), which the soft limit cannot pass. Nil when
    /// there is nothing to raise.
    public func raiseTarget(nrOpen: Int?) -> Int? {
        var target = hard
        if target == Int.max, let nrOpen { target = nrOpen }
        return target > soft ? target : nil
    }

    // MARK: The process

    /// The limit of this process; nil when it cannot be read.
    public static func current() -> DescriptorLimit? {
        var limit = rlimit()
        guard getrlimit(Self.resource, &limit) == 0 else { return nil }
        return DescriptorLimit(soft: Self.int(limit.rlim_cur), hard: Self.int(limit.rlim_max))
    }

    /// What `raiseSoftToHard()` did.
    public struct Raise: Sendable, Equatable {
        /// The limit before; nil when it could not be read.
        public var before: DescriptorLimit?
        /// The limit in force now.
        public var after: DescriptorLimit?
        /// Why raising failed (the soft limit is then unchanged); nil when it was raised or already at the top.
        public var failure: String?

        public var raised: Bool { before != nil && after != nil && before!.soft < after!.soft }
    }

    /// Raises the soft limit to the hard one, as servers do at start (nginx's `worker_rlimit_nofile`, Go's
    /// runtime since 1.19). No call is made when they are already equal (under systemd with `LimitNOFILE=`,
    /// whose `@resources` system calls the unit's filter refuses anyway).
    public static func raiseSoftToHard() -> Raise {
        guard let before = current() else {
            return Raise(before: nil, after: nil, failure: "getrlimit: \(String(cString: strerror(errno)))")
        }
        guard let target = before.raiseTarget(nrOpen: readNrOpen()) else {
            return Raise(before: before, after: before, failure: nil)
        }
        var limit = rlimit(
            rlim_cur: rlim_t(target), rlim_max: before.hard == Int.max ? Self.infinity : rlim_t(before.hard))
        guard setrlimit(Self.resource, &limit) == 0 else {
            let reason = String(cString: strerror(errno))
            return Raise(before: before, after: before, failure: "setrlimit: \(reason)")
        }
        return Raise(before: before, after: current() ?? before, failure: nil)
    }

    private static func readNrOpen() -> Int? {
        guard let file = fopen("/proc/sys/fs/nr_open", "r") else { return nil }
        defer { fclose(file) }
        var buffer = [CChar](repeating: 0, count: 32)
        guard fgets(&buffer, 32, file) != nil else { return nil }
        let text = String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let value = Int(text.filter(\.isNumber)), value > 0 else { return nil }
        return value
    }

    private static func int(_ value: rlim_t) -> Int {
        value == Self.infinity ? Int.max : Int(clamping: value)
    }

    /// `RLIM_INFINITY` (all bits set), which Swift cannot import as a literal.
    private static let infinity = rlim_t.max

    #if os(Linux)
        private static let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
    #else
        private static let resource = RLIMIT_NOFILE
    #endif
}
