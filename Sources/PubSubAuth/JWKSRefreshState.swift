/// When the broker fetches a JWKS (`--jwt-jwks-url`): a plain state machine, time an input (seconds on a
/// monotonic clock), so that the schedule and the unknown-kid rate limit are tested without a server or a clock.
///
/// Events go in (`tick`, `unknownKid`, `fetchSucceeded`, `fetchFailed`), an `Action` comes out; `JWKSKeySource`
/// performs it. One fetch at a time:
/// - the schedule: a fetch is due `refreshInterval` after the last good one (at once at start), `retryInterval`
///   after a failed one;
/// - a token whose `kid` is not among the keys held asks for a fetch, at most once every `unknownKidInterval`
///   (a flood of forged kids costs the provider one request per interval, not one per token); while any fetch is
///   in flight it waits for that one instead.
public struct JWKSRefreshState: Sendable, Equatable {
    public struct Configuration: Sendable, Equatable {
        /// Seconds between fetches while the provider answers (`--jwt-jwks-refresh`, default 300).
        public var refreshInterval: Double
        /// Seconds an unknown kid must wait after the last fetch an unknown kid asked for.
        public var unknownKidInterval: Double
        /// Seconds after a failed fetch before the schedule tries again (never more than `refreshInterval`).
        public var retryInterval: Double

        public init(refreshInterval: Double = 300, unknownKidInterval: Double = 10, retryInterval: Double = 30) {
            self.refreshInterval = refreshInterval
            self.unknownKidInterval = unknownKidInterval
            self.retryInterval = min(retryInterval, refreshInterval)
        }
    }

    /// Why a fetch is made (logs, tests).
    public enum Reason: String, Sendable, Equatable {
        case schedule
        case unknownKid = "unknown_kid"
    }

    public enum Action: Sendable, Equatable {
        /// Nothing to do: use the keys held.
        case none
        /// Fetch now, then report `fetchSucceeded` or `fetchFailed`.
        case fetch(Reason)
        /// A fetch is in flight: wait for it to end, then look at the keys again.
        case wait
        /// An unknown kid within `unknownKidInterval` of the last such fetch: no fetch, the token is refused.
        case refuse
    }

    public let configuration: Configuration
    /// The fetch in flight, if any.
    public private(set) var fetching: Reason?
    /// When the schedule's next fetch is due.
    public private(set) var nextRefresh: Double
    /// When an unknown kid last started a fetch.
    public private(set) var lastUnknownKidFetch: Double?
    /// Whether a good key set was ever fetched (without one every token is refused: fail closed).
    public private(set) var hasKeys = false
    /// Failed fetches since the last good one.
    public private(set) var consecutiveFailures = 0

    /// The first fetch is due at once.
    public init(configuration: Configuration = .init(), now: Double) {
        self.configuration = configuration
        self.nextRefresh = now
    }

    /// The clock moved (the refresh service woke up, or a token arrived): a fetch when the schedule says so.
    /// `.wait` when one is due but another is in flight (a token does not wait for it; the service does).
    public mutating func tick(now: Double) -> Action {
        guard now >= nextRefresh else { return .none }
        guard fetching == nil else { return .wait }
        fetching = .schedule
        return .fetch(.schedule)
    }

    /// A token names a kid that the keys held do not have (or no keys are held at all).
    public mutating func unknownKid(now: Double) -> Action {
        if fetching != nil { return .wait }
        if let last = lastUnknownKidFetch, now < last + configuration.unknownKidInterval { return .refuse }
        lastUnknownKidFetch = now
        fetching = .unknownKid
        return .fetch(.unknownKid)
    }

    /// A good key set arrived (it replaces the keys held).
    public mutating func fetchSucceeded(now: Double) {
        fetching = nil
        hasKeys = true
        consecutiveFailures = 0
        nextRefresh = now + configuration.refreshInterval
    }

    /// The provider was down, slow, or answered something that is not a usable key set: the keys held stay.
    public mutating func fetchFailed(now: Double) {
        fetching = nil
        consecutiveFailures += 1
        nextRefresh = now + configuration.retryInterval
    }
}
