import NIOCore
import Testing

@testable import PubSubServer

/// The bound on failed `/api` authentications per address, driven without sockets (time is an input).
@Suite struct APIAuthFailuresTests {
    static let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    @Test func pastTheBoundAnAddressIsThrottledUntilItsWindowEnds() {
        var failures = APIAuthFailures(settings: .init(maxFailures: 3, window: .seconds(60), maxAddresses: 100))
        for k in 0..<3 {
            #expect(failures.check("10.0.0.1", now: Self.t0 + .seconds(Int64(k))) == .allowed)
            failures.failed("10.0.0.1", now: Self.t0 + .seconds(Int64(k)))
        }
        #expect(failures.check("10.0.0.1", now: Self.t0 + .seconds(3)) == .throttled(retryAfter: 57))
        #expect(failures.check("10.0.0.2", now: Self.t0 + .seconds(3)) == .allowed, "other addresses are not affected")
        #expect(failures.check("10.0.0.1", now: Self.t0 + .milliseconds(59_500)) == .throttled(retryAfter: 1))
        #expect(failures.check("10.0.0.1", now: Self.t0 + .seconds(60)) == .allowed)
        // A failure after the window starts a new one.
        failures.failed("10.0.0.1", now: Self.t0 + .seconds(61))
        #expect(failures.check("10.0.0.1", now: Self.t0 + .seconds(62)) == .allowed)
    }

    /// Remembered addresses are bounded: ended windows go first, then the oldest.
    @Test func rememberedAddressesAreBounded() {
        var failures = APIAuthFailures(settings: .init(maxFailures: 1, window: .seconds(60), maxAddresses: 3))
        for k in 0..<3 { failures.failed("a\(k)", now: Self.t0 + .seconds(Int64(k))) }
        #expect(failures.count == 3)
        failures.failed("b", now: Self.t0 + .seconds(10))
        #expect(failures.count == 3)
        #expect(failures.check("a0", now: Self.t0 + .seconds(10)) == .allowed, "the oldest went")
        #expect(failures.check("b", now: Self.t0 + .seconds(10)) != .allowed)
        for k in 0..<1000 { failures.failed("c\(k)", now: Self.t0 + .seconds(120)) }
        #expect(failures.count == 3)
    }
}
