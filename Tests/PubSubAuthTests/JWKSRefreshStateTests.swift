import Testing

@testable import PubSubAuth

/// The JWKS schedule and the unknown-kid rate limit, driven with times (seconds) and no server.
@Suite struct JWKSRefreshStateTests {
    let configuration = JWKSRefreshState.Configuration(refreshInterval: 300, unknownKidInterval: 10, retryInterval: 30)

    @Test func fetchesAtStartThenEveryRefreshInterval() {
        var state = JWKSRefreshState(configuration: configuration, now: 100)
        #expect(state.tick(now: 100) == .fetch(.schedule))
        // One fetch at a time: a token arriving meanwhile uses the keys held (the service waits).
        #expect(state.tick(now: 101) == .wait)
        state.fetchSucceeded(now: 102)
        #expect(state.hasKeys)
        #expect(state.nextRefresh == 402)
        #expect(state.tick(now: 401.9) == .none)
        #expect(state.tick(now: 402) == .fetch(.schedule))
        state.fetchSucceeded(now: 402.5)
        #expect(state.tick(now: 500) == .none)
        #expect(state.nextRefresh == 702.5)
    }

    @Test func aFailedFetchKeepsTheKeysAndRetriesSooner() {
        var state = JWKSRefreshState(configuration: configuration, now: 0)
        #expect(state.tick(now: 0) == .fetch(.schedule))
        state.fetchSucceeded(now: 1)
        #expect(state.tick(now: 301) == .fetch(.schedule))
        state.fetchFailed(now: 306)
        #expect(state.hasKeys)  // what was fetched before stays
        #expect(state.consecutiveFailures == 1)
        #expect(state.nextRefresh == 336)
        #expect(state.tick(now: 335) == .none)
        #expect(state.tick(now: 336) == .fetch(.schedule))
        state.fetchFailed(now: 337)
        #expect(state.consecutiveFailures == 2)
        #expect(state.tick(now: 367) == .fetch(.schedule))
        state.fetchSucceeded(now: 368)
        #expect(state.consecutiveFailures == 0)
        #expect(state.nextRefresh == 668)
    }

    @Test func theRetryIsNeverLaterThanTheRefresh() {
        let short = JWKSRefreshState.Configuration(refreshInterval: 2, unknownKidInterval: 10, retryInterval: 30)
        #expect(short.retryInterval == 2)
        var state = JWKSRefreshState(configuration: short, now: 0)
        _ = state.tick(now: 0)
        state.fetchFailed(now: 0.5)
        #expect(state.nextRefresh == 2.5)
    }

    @Test func anUnknownKidFetchesAtMostOncePerInterval() {
        var state = JWKSRefreshState(configuration: configuration, now: 0)
        _ = state.tick(now: 0)
        state.fetchSucceeded(now: 0)
        #expect(state.unknownKid(now: 50) == .fetch(.unknownKid))
        // Tokens meeting that fetch wait for it instead of asking for another.
        #expect(state.unknownKid(now: 50.1) == .wait)
        state.fetchSucceeded(now: 50.2)
        // A flood of forged kids: refused without a fetch until the interval has passed.
        for t in stride(from: 50.3, to: 60, by: 0.1) {
            #expect(state.unknownKid(now: t) == .refuse)
        }
        #expect(state.unknownKid(now: 60) == .fetch(.unknownKid))
        state.fetchFailed(now: 61)
        #expect(state.unknownKid(now: 65) == .refuse)
        #expect(state.unknownKid(now: 70) == .fetch(.unknownKid))
    }

    @Test func anUnknownKidFetchMovesTheSchedule() {
        var state = JWKSRefreshState(configuration: configuration, now: 0)
        _ = state.tick(now: 0)
        state.fetchSucceeded(now: 0)
        #expect(state.unknownKid(now: 200) == .fetch(.unknownKid))
        // The schedule's fetch is due at 300 but one is in flight: a token does not start another.
        #expect(state.tick(now: 300) == .wait)
        state.fetchSucceeded(now: 300.5)
        #expect(state.tick(now: 301) == .none)
        #expect(state.nextRefresh == 600.5)
    }

    @Test func aScheduledFetchInFlightIsWaitedForNotDoubled() {
        var state = JWKSRefreshState(configuration: configuration, now: 0)
        #expect(state.tick(now: 0) == .fetch(.schedule))
        #expect(state.unknownKid(now: 0.1) == .wait)
        #expect(state.lastUnknownKidFetch == nil)  // waiting does not spend the unknown-kid budget
        state.fetchFailed(now: 5)
        #expect(state.unknownKid(now: 5.1) == .fetch(.unknownKid))
    }

    @Test func withoutAGoodFetchNothingIsHeld() {
        var state = JWKSRefreshState(configuration: configuration, now: 0)
        _ = state.tick(now: 0)
        state.fetchFailed(now: 5)
        #expect(!state.hasKeys)
        // Every token's kid is unknown: one fetch per interval, the rest refused (fail closed).
        #expect(state.unknownKid(now: 6) == .fetch(.unknownKid))
        state.fetchFailed(now: 6.5)
        #expect(state.unknownKid(now: 7) == .refuse)
        #expect(!state.hasKeys)
        #expect(state.consecutiveFailures == 2)
    }
}
