import CoreMetrics
import JWTKit
import Logging
import NIOConcurrencyHelpers
import NIOCore

/// Settings of `--jwt-jwks-url`.
public struct JWKSSettings: Sendable, Equatable {
    public var url: String
    /// Seconds between fetches (`--jwt-jwks-refresh`).
    public var refreshInterval: Double
    /// Seconds between two fetches asked for by unknown kids.
    public var unknownKidInterval: Double
    /// The whole fetch, connection to last byte.
    public var timeout: TimeAmount
    /// A larger answer is a failure (`too_large`).
    public var maxBytes: Int

    public init(
        url: String, refreshInterval: Double = 300, unknownKidInterval: Double = 10, timeout: TimeAmount = .seconds(5),
        maxBytes: Int = 1 << 20
    ) {
        self.url = url
        self.refreshInterval = refreshInterval
        self.unknownKidInterval = unknownKidInterval
        self.timeout = timeout
        self.maxBytes = maxBytes
    }
}

/// The keys of a JWKS URL, as OIDC providers publish them: fetched at start, refetched on a schedule and when a
/// token names a kid not held (rate-limited), the last good set kept while the provider is down or answers
/// garbage. Without a good set ever, every token it is asked about is refused (fail closed).
///
/// `JWKSRefreshState` decides; this class holds it behind a lock with the keys, performs its actions after
/// unlocking (a fetch, waking the tokens that waited for one), logs and counts. Fetches are made by whoever
/// the state machine hands them to: `run()` (the refresh service, on time), or the verification of a token that
/// finds a fetch due (it waits for it; tokens arriving meanwhile use the keys held) or whose kid is unknown (it
/// and the tokens that meet the same fetch wait for it).
public final class JWKSKeySource: Sendable {
    /// Fetches the JWKS body; throws `JWKSFailure` (any other error counts as `unreachable`).
    public typealias Fetcher = @Sendable () async throws -> ByteBuffer

    public let settings: JWKSSettings
    let fetcher: Fetcher
    let clock: @Sendable () -> Double
    let logger: Logger
    private let state: NIOLockedValueBox<Locked>
    private let metrics: Metrics

    private struct Locked {
        var machine: JWKSRefreshState
        var keys: JWKSKeySet?
        /// Tokens (and the refresh service) waiting for the fetch in flight.
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    /// `fetcher` defaults to a GET of `settings.url` with `client`, bounded by `settings.timeout` and
    /// `settings.maxBytes`; `clock` is monotonic seconds.
    public init(
        settings: JWKSSettings, fetcher: Fetcher? = nil, clock: @escaping @Sendable () -> Double = JWKSKeySource.uptime,
        logger: Logger = Logger(label: "pubsub.auth.jwks")
    ) {
        self.settings = settings
        self.fetcher = fetcher ?? Self.httpFetcher(settings: settings)
        self.clock = clock
        self.logger = logger
        let configuration = JWKSRefreshState.Configuration(
            refreshInterval: settings.refreshInterval, unknownKidInterval: settings.unknownKidInterval)
        self.state = NIOLockedValueBox(Locked(machine: JWKSRefreshState(configuration: configuration, now: clock())))
        self.metrics = Metrics()
    }

    /// Monotonic seconds (NIO's uptime clock).
    public static let uptime: @Sendable () -> Double = { Double(NIODeadline.now().uptimeNanoseconds) / 1e9 }

    /// The keys held now (nil: none was ever fetched).
    public var keys: JWKSKeySet? { state.withLockedValue { $0.keys } }

    /// The state machine as it is now (tests, logs).
    public var refreshState: JWKSRefreshState { state.withLockedValue { $0.machine } }

    /// Fetches when the schedule says so (at start: at once), and returns when that fetch has ended; returns at
    /// once when nothing is due or another fetch is in flight. True when it fetched.
    @discardableResult
    public func refreshIfDue() async -> Bool {
        let now = clock()
        guard case .fetch(let reason) = state.withLockedValue({ $0.machine.tick(now: now) }) else { return false }
        await fetch(reason)
        return true
    }

    /// The schedule, until the task is cancelled (the refresh service: graceful shutdown cancels it).
    public func run() async {
        while !Task.isCancelled {
            let now = clock()
            let (action, due) = state.withLockedValue { ($0.machine.tick(now: now), $0.machine.nextRefresh) }
            switch action {
            case .fetch(let reason): await fetch(reason)
            case .wait: await waitForFetch()
            case .none, .refuse:
                do { try await Task.sleep(nanoseconds: UInt64(max(0.01, due - now) * 1e9)) } catch { return }
            }
        }
    }

    /// Verifies a token with the key its header names (`alg`, `kid`). A token that finds a fetch due makes it and
    /// waits for it; a kid not held asks for a fetch (`JWKSRefreshState.unknownKid`) and waits for it, or for the
    /// fetch in flight. One fetch per token at most: a kid that the freshest keys do not have is refused.
    func verify(_ token: String, algorithm: JWTAuthorizer.Algorithm, kid: String?) async -> JWTClaims? {
        guard let kid, !kid.isEmpty else { return nil }
        var fetched = await refreshIfDue()
        while true {
            let keys = state.withLockedValue { $0.keys }
            if let keys, keys.has(algorithm, kid: kid) {
                return await keys.verify(token, algorithm: algorithm, kid: kid)
            }
            if fetched { return nil }
            let now = clock()
            switch state.withLockedValue({ $0.machine.unknownKid(now: now) }) {
            case .fetch(let reason): await fetch(reason)
            case .wait: await waitForFetch()
            case .none, .refuse:
                logger.debug(
                    "JWKS: unknown kid, not refetched (rate-limited)",
                    metadata: ["pubsub.jwks.kid": "\(kid)", "pubsub.jwks.url": "\(settings.url)"])
                return nil
            }
            fetched = true
        }
    }

    /// Suspends until the fetch in flight ends (at once when none is).
    private func waitForFetch() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let waiting = state.withLockedValue { locked -> Bool in
                guard locked.machine.fetching != nil else { return false }
                locked.waiters.append(continuation)
                return true
            }
            if !waiting { continuation.resume() }
        }
    }

    /// Performs a fetch the state machine asked for and reports its end; wakes the waiters after unlocking.
    private func fetch(_ reason: JWKSRefreshState.Reason) async {
        let result: Result<JWKSKeySet, JWKSFailure>
        do {
            let body = try await fetcher()
            result = .success(try await JWKSKeySet.parse(body))
        } catch let failure as JWKSFailure {
            result = .failure(failure)
        } catch {
            result = .failure(JWKSFailure(.unreachable, "\(error)"))
        }
        let now = clock()
        let (previous, waiters, failures) = state.withLockedValue { locked in
            let previous = locked.keys
            switch result {
            case .success(let keys):
                locked.machine.fetchSucceeded(now: now)
                locked.keys = keys
            case .failure:
                locked.machine.fetchFailed(now: now)
            }
            let waiters = locked.waiters
            locked.waiters = []
            return (previous, waiters, locked.machine.consecutiveFailures)
        }
        for waiter in waiters { waiter.resume() }
        var metadata: Logger.Metadata = [
            "pubsub.jwks.url": "\(settings.url)", "pubsub.jwks.reason": "\(reason.rawValue)",
        ]
        switch result {
        case .success(let keys):
            metrics.keys.record(keys.count)
            let kids = Self.describe(keys)
            metadata["pubsub.jwks.kids"] = "\(kids)"
            if previous.map(Self.describe) != kids {
                logger.info("JWKS keys: \(kids)", metadata: metadata)
            } else {
                logger.debug("JWKS refreshed, keys unchanged", metadata: metadata)
            }
        case .failure(let failure):
            metrics.failures[failure.code]?.increment()
            metadata["pubsub.jwks.failure"] = "\(failure.code.rawValue)"
            metadata["pubsub.error"] = "\(failure.detail)"
            metadata["pubsub.jwks.failures"] = "\(failures)"
            if let previous {
                logger.warning("JWKS fetch failed: keeping the last \(previous.count) key(s)", metadata: metadata)
            } else {
                logger.warning("JWKS fetch failed: no keys yet, every JWKS token is refused", metadata: metadata)
            }
        }
    }

    /// `RS256 a, b; ES256 c`, in a stable order.
    static func describe(_ keys: JWKSKeySet) -> String {
        JWTAuthorizer.Algorithm.allCases.compactMap { algorithm in
            keys.kids[algorithm].map { "\(algorithm.rawValue) \($0.sorted().joined(separator: ", "))" }
        }.joined(separator: "; ")
    }

    struct Metrics: Sendable {
        let failures: [JWKSFailure.Code: Counter] = Dictionary(
            uniqueKeysWithValues: JWKSFailure.Code.allCases.map {
                ($0, Counter(label: "pubsub_jwks_refresh_failures_total", dimensions: [("reason", $0.rawValue)]))
            })
        /// The keys held after the last good fetch (0 until one: every JWKS token is refused).
        let keys = Gauge(label: "pubsub_jwks_keys")
    }
}
