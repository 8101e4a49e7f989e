import NIOCore

/// Failed `/api` authentications by client address, so that a key cannot be guessed at wire speed: past
/// `maxFailures` failures within `window` of an address's first one, every `/api` request from that address is
/// answered 429 (with `Retry-After`) until the window ends, whatever key it carries. A plain state machine: time is
/// an input, and the caller answers, counts and logs.
///
/// Bounded: at most `maxAddresses` addresses are remembered; past that the ones whose window has ended go first,
/// then the oldest window.
struct APIAuthFailures: Sendable {
    struct Settings: Sendable, Equatable {
        var maxFailures = 10
        var window = TimeAmount.seconds(60)
        var maxAddresses = 10_000
    }

    enum Verdict: Equatable {
        case allowed
        /// Too many failures: answer 429, retry after this many seconds.
        case throttled(retryAfter: Int)
    }

    let settings: Settings
    private var entries: [String: (start: NIODeadline, failures: Int)] = [:]

    init(settings: Settings = Settings()) { self.settings = settings }

    var count: Int { entries.count }

    /// Whether a request from `address` may try a key now.
    func check(_ address: String, now: NIODeadline) -> Verdict {
        guard let entry = entries[address], entry.failures >= settings.maxFailures else { return .allowed }
        let end = entry.start + settings.window
        guard now < end else { return .allowed }
        let seconds = (end - now).nanoseconds
        return .throttled(retryAfter: Int((seconds + 999_999_999) / 1_000_000_000))
    }

    /// A request from `address` carried no key or a wrong one.
    mutating func failed(_ address: String, now: NIODeadline) {
        if var entry = entries[address], now < entry.start + settings.window {
            entry.failures += 1
            entries[address] = entry
            return
        }
        if entries[address] == nil && entries.count >= settings.maxAddresses { makeRoom(now: now) }
        entries[address] = (now, 1)
    }

    private mutating func makeRoom(now: NIODeadline) {
        entries = entries.filter { now < $0.value.start + settings.window }
        while entries.count >= settings.maxAddresses,
            let oldest = entries.min(by: { $0.value.start < $1.value.start })?.key
        {
            entries[oldest] = nil
        }
    }
}
