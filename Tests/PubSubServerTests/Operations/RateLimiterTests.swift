import NIOCore
import Testing

@testable import PubSubServer

@Suite struct TokenBucketsTests {
    let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)

    @Test func burstThenRefusalWithHonestHeaders() {
        var buckets = TokenBuckets(limit: 5, window: .seconds(10))
        for expected in (0..<5).reversed() {
            let v = buckets.take("a", cost: 1, now: t0)
            #expect(v.allowed)
            #expect(v.limit == 5)
            #expect(v.remaining == expected)
            #expect(v.retryAfterSeconds == 0)
        }
        let refused = buckets.take("a", cost: 1, now: t0)
        #expect(!refused.allowed)
        #expect(refused.remaining == 0)
        // One token comes back every 2 s; the bucket is full again after 10 s.
        #expect(refused.retryAfterSeconds == 2)
        #expect(refused.resetSeconds == 10)
    }

    @Test func refillsOverTheWindow() {
        var buckets = TokenBuckets(limit: 4, window: .seconds(4))
        for _ in 0..<4 { _ = buckets.take("a", cost: 1, now: t0) }
        #expect(!buckets.take("a", cost: 1, now: t0 + .milliseconds(500)).allowed)
        let later = buckets.take("a", cost: 1, now: t0 + .milliseconds(1_001))
        #expect(later.allowed)
        #expect(later.remaining == 0)
        #expect(buckets.peek("a", cost: 4, now: t0 + .seconds(10)).allowed)
    }

    @Test func keysAreIndependent() {
        var buckets = TokenBuckets(limit: 2, window: .seconds(1))
        _ = buckets.take("a", cost: 2, now: t0)
        #expect(!buckets.take("a", cost: 1, now: t0).allowed)
        let other = buckets.take("b", cost: 1, now: t0)
        #expect(other.allowed)
        #expect(other.remaining == 1)
    }

    @Test func aRefusedRequestSpendsNothing() {
        var buckets = TokenBuckets(limit: 10, window: .seconds(10))
        _ = buckets.take("a", cost: 7, now: t0)
        let refused = buckets.take("a", cost: 5, now: t0)
        #expect(!refused.allowed)
        #expect(refused.remaining == 3)
        #expect(refused.retryAfterSeconds == 2)
        #expect(buckets.take("a", cost: 3, now: t0).allowed)
    }

    @Test func aRequestLargerThanTheLimitWaitsForAFullBucket() {
        var buckets = TokenBuckets(limit: 3, window: .seconds(3))
        let v = buckets.take("a", cost: 5, now: t0)
        #expect(!v.allowed)
        #expect(v.remaining == 3)
        #expect(v.retryAfterSeconds == 1)
    }

    @Test func pruneForgetsFullBucketsOnlyAndBoundsTheTable() {
        var buckets = TokenBuckets(limit: 2, window: .seconds(2), maxKeys: 10)
        _ = buckets.take("spent", cost: 2, now: t0)
        _ = buckets.take("full-again", cost: 1, now: t0 - .seconds(5))
        buckets.prune(now: t0)
        #expect(Set(buckets.buckets.keys) == ["spent"])
        for i in 0..<50 { _ = buckets.take("k\(i)", cost: 2, now: t0) }
        #expect(buckets.buckets.count <= 10)
    }
}

@Suite struct PublishRateLimiterTests {
    let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)

    @Test func bothLimitsApplyAndTheTighterOneIsReported() {
        let limiter = PublishRateLimiter(.init(perIP: 10, perToken: 3, window: .seconds(60)))
        let first = limiter.check(ip: "10.0.0.1", token: "t", cost: 1, now: t0)
        #expect(first?.verdict.allowed == true)
        #expect(first?.scope == .token)
        #expect(first?.verdict.remaining == 2)
        _ = limiter.check(ip: "10.0.0.1", token: "t", cost: 2, now: t0)
        let refused = limiter.check(ip: "10.0.0.1", token: "t", cost: 1, now: t0)
        #expect(refused?.verdict.allowed == false)
        #expect(refused?.scope == .token)
        // The refusal spent nothing from the IP budget: 10 - 3 left 7.
        let ipOnly = limiter.check(ip: "10.0.0.1", token: nil, cost: 1, now: t0)
        #expect(ipOnly?.scope == .ip)
        #expect(ipOnly?.verdict.remaining == 6)
    }

    @Test func noLimitNoVerdict() {
        let limiter = PublishRateLimiter(.init(perIP: nil, perToken: 5, window: .seconds(1)))
        #expect(limiter.check(ip: "10.0.0.1", token: nil, cost: 1, now: t0) == nil)
    }
}
