import NIOConcurrencyHelpers
import NIOCore

/// Token buckets keyed by a string (an IP address, a publish token): each holds up to `limit` tokens and
/// refills at `limit` per `window`, so a key may send a burst of `limit` and then `limit` per window.
/// A pure value; time is an input.
struct TokenBuckets {
    struct Bucket {
        var tokens: Double
        var updated: NIODeadline
    }

    /// What one key may still do, as the `X-RateLimit-*` headers and `Retry-After` tell it.
    struct Verdict: Equatable {
        var allowed: Bool
        var limit: Int
        /// Whole tokens left after this request (before it, when refused).
        var remaining: Int
        /// Seconds until the bucket is full again.
        var resetSeconds: Int
        /// Seconds until a request of the same cost would pass; 0 when allowed.
        var retryAfterSeconds: Int
    }

    let limit: Int
    let window: TimeAmount
    /// Keys kept at most; beyond it full buckets are forgotten first, then arbitrary ones (which only forgives).
    let maxKeys: Int
    private(set) var buckets: [String: Bucket] = [:]

    init(limit: Int, window: TimeAmount, maxKeys: Int = 100_000) {
        precondition(limit > 0 && window > .zero)
        self.limit = limit
        self.window = window
        self.maxKeys = maxKeys
    }

    private var perSecond: Double { Double(limit) / (Double(window.nanoseconds) / 1e9) }

    private func refilled(_ bucket: Bucket?, now: NIODeadline) -> Bucket {
        guard var bucket else { return Bucket(tokens: Double(limit), updated: now) }
        let elapsed = Double(max(0, (now - bucket.updated).nanoseconds)) / 1e9
        bucket.tokens = min(Double(limit), bucket.tokens + elapsed * perSecond)
        bucket.updated = now
        return bucket
    }

    /// The verdict for spending `cost` tokens, without spending them.
    func peek(_ key: String, cost: Int, now: NIODeadline) -> Verdict {
        verdict(refilled(buckets[key], now: now), cost: cost)
    }

    /// Spends `cost` tokens if they are there; returns the verdict either way.
    mutating func take(_ key: String, cost: Int, now: NIODeadline) -> Verdict {
        var bucket = refilled(buckets[key], now: now)
        let verdict = self.verdict(bucket, cost: cost)
        if verdict.allowed {
            bucket.tokens -= Double(cost)
            if buckets[key] == nil, buckets.count >= maxKeys { prune(now: now, force: true) }
            buckets[key] = bucket
            return self.verdict(bucket, cost: 0)
        }
        buckets[key] = bucket
        return verdict
    }

    private func verdict(_ bucket: Bucket, cost: Int) -> Verdict {
        let allowed = bucket.tokens + 1e-9 >= Double(cost)
        let missingForFull = Double(limit) - bucket.tokens
        let reset = Int((missingForFull / perSecond).rounded(.up))
        var retry = 0
        if !allowed {
            // A request costing more than the whole bucket can never pass; it is told to wait for a full one.
            let needed = Double(min(cost, limit)) - bucket.tokens
            retry = max(1, Int((needed / perSecond).rounded(.up)))
        }
        return Verdict(
            allowed: allowed, limit: limit, remaining: max(0, Int((bucket.tokens + 1e-9).rounded(.down))),
            resetSeconds: max(0, reset), retryAfterSeconds: retry)
    }

    /// Forgets full buckets (a fresh key starts full, so nothing changes for them); with `force`, also
    /// arbitrary ones until a tenth of the room is free.
    mutating func prune(now: NIODeadline, force: Bool = false) {
        buckets = buckets.filter { refilled($0.value, now: now).tokens < Double(limit) }
        if force, buckets.count >= maxKeys {
            let excess = buckets.count - maxKeys * 9 / 10
            for key in buckets.keys.prefix(excess) { buckets[key] = nil }
        }
    }
}

/// The publish rate limits of the HTTP transports: one set of buckets per client IP, one per publish token.
/// When both apply, a request must pass both; the headers describe the tighter one.
final class PublishRateLimiter: Sendable {
    struct Limits: Sendable {
        var perIP: Int?
        var perToken: Int?
        var window: TimeAmount
    }

    private let state: NIOLockedValueBox<(ip: TokenBuckets?, token: TokenBuckets?)>

    init(_ limits: Limits) {
        state = NIOLockedValueBox(
            (
                limits.perIP.map { TokenBuckets(limit: $0, window: limits.window) },
                limits.perToken.map { TokenBuckets(limit: $0, window: limits.window) }
            ))
    }

    enum Scope: String, Sendable {
        case ip
        case token
    }

    /// Spends `cost` (the number of publish messages in the request) from every bucket that applies, or from
    /// none if any of them refuses. Nil when no limit applies to this request.
    func check(ip: String?, token: String?, cost: Int, now: NIODeadline)
        -> (verdict: TokenBuckets.Verdict, scope: Scope)?
    {
        state.withLockedValue { s in
            var candidates: [(TokenBuckets.Verdict, Scope)] = []
            if let ip, let buckets = s.ip { candidates.append((buckets.peek(ip, cost: cost, now: now), .ip)) }
            if let token, let buckets = s.token {
                candidates.append((buckets.peek(token, cost: cost, now: now), .token))
            }
            guard !candidates.isEmpty else { return nil }
            if let refused = candidates.filter({ !$0.0.allowed }).max(by: {
                $0.0.retryAfterSeconds < $1.0.retryAfterSeconds
            }) {
                return refused
            }
            var after: [(TokenBuckets.Verdict, Scope)] = []
            if let ip, s.ip != nil { after.append((s.ip!.take(ip, cost: cost, now: now), .ip)) }
            if let token, s.token != nil { after.append((s.token!.take(token, cost: cost, now: now), .token)) }
            return after.min(by: { $0.0.remaining < $1.0.remaining })
        }
    }

    /// Forgets buckets that are full again (called by the server's periodic sweep).
    func prune(now: NIODeadline) {
        state.withLockedValue { s in
            s.ip?.prune(now: now)
            s.token?.prune(now: now)
        }
    }
}
