import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import PubSubTesting
import Testing

@testable import PubSubServer

#if canImport(Glibc)
    import Glibc
#endif

@Suite(.serialized) struct WatchdogTests {
    @Test(.timeLimit(.minutes(1))) func pingsOnlyWhileEveryLoopRuns() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 3)
        let pings = NIOLockedValueBox(0)
        let loops = group.makeIterator().map { $0 }
        let watchdog = Watchdog(loops: loops) { pings.withLockedValue { $0 += 1 } }
        watchdog.start(every: .milliseconds(20))
        #expect(try await waitUntil { pings.withLockedValue { $0 } >= 5 })

        // Block the last loop: no round can finish, so no ping goes out.
        let release = NIOLockedValueBox(false)
        let blocked = NIOLockedValueBox(false)
        loops[2].execute {
            blocked.withLockedValue { $0 = true }
            while !release.withLockedValue({ $0 }) { usleep(1000) }
        }
        #expect(try await waitUntil { blocked.withLockedValue { $0 } })
        let whileStuck = pings.withLockedValue { $0 }
        // A quiet window: a round that was under way may still end (one ping), no other.
        try await Task.sleep(nanoseconds: 400_000_000)
        #expect(pings.withLockedValue { $0 } <= whileStuck + 1)

        // Unblocked, the pings come back.
        release.withLockedValue { $0 = true }
        #expect(try await waitUntil { pings.withLockedValue { $0 } >= whileStuck + 3 })

        watchdog.stop()
        let afterStop = pings.withLockedValue { $0 }
        try await Task.sleep(nanoseconds: 150_000_000)
        #expect(pings.withLockedValue { $0 } <= afterStop + 1)
        try await group.shutdownGracefully()
    }
}
