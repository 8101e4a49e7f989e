import NIOCore
import Testing

@testable import PubSubRedis

/// The command timeout: no reply for `timeout` while the loop could read, not "a command older than `timeout`".
@Suite struct ReplyDeadlineTests {
    let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    func deadline() -> ReplyDeadline { ReplyDeadline(timeout: .seconds(5), period: .milliseconds(1250)) }

    /// Checks every period from `from` up to `to` (excluded); true at the first that gives up.
    func checks(_ d: inout ReplyDeadline, from: TimeAmount, to: TimeAmount, waiting: Bool = true) -> TimeAmount? {
        var at = from
        while at < to {
            if d.check(now: t0 + at, waiting: waiting) { return at }
            at = at + .milliseconds(1250)
        }
        return nil
    }

    @Test func aSilentServerIsGivenUpAfterTheTimeout() {
        var d = deadline()
        _ = d.check(now: t0, waiting: false)
        d.sent(now: t0, idle: true)
        let found = checks(&d, from: .milliseconds(1250), to: .seconds(20))
        #expect(found == .milliseconds(6250))
    }

    @Test func nothingAwaitedNeverTimesOut() {
        var d = deadline()
        d.sent(now: t0, idle: true)
        d.replied(now: t0 + .milliseconds(1))
        let found = checks(&d, from: .milliseconds(1250), to: .seconds(60), waiting: false)
        #expect(found == nil)
    }

    @Test func repliesThatKeepComingKeepTheConnectionWhateverTheOldestCommandsAge() {
        var d = deadline()
        _ = d.check(now: t0, waiting: false)
        d.sent(now: t0, idle: true)
        // A long pipeline: commands keep being sent and replies keep being read, each one second after the last.
        var at = TimeAmount.zero
        var gaveUp = false
        while at < .seconds(30) {
            at = at + .seconds(1)
            d.sent(now: t0 + at, idle: false)
            d.replied(now: t0 + at)
            if d.check(now: t0 + at + .milliseconds(10), waiting: true) { gaveUp = true }
        }
        #expect(!gaveUp)
    }

    @Test func aLateCheckGivesTheLoopOneMorePeriodToReadWhatArrived() {
        var d = deadline()
        _ = d.check(now: t0, waiting: false)
        d.sent(now: t0, idle: true)
        // The loop stalls for 8 s: the first check after it is late and does not judge.
        let verdict1 = d.check(now: t0 + .seconds(8), waiting: true)

        #expect(!verdict1)
        // The reply was in the socket: read right after the stall.
        d.replied(now: t0 + .seconds(8) + .milliseconds(5))
        let found = checks(&d, from: .seconds(8) + .milliseconds(1250), to: .seconds(13))
        #expect(found == nil)
    }

    @Test func aLateCheckStillGivesUpOnASilentServerAPeriodLater() {
        var d = deadline()
        _ = d.check(now: t0, waiting: false)
        d.sent(now: t0, idle: true)
        let verdict2 = d.check(now: t0 + .seconds(8), waiting: true)

        #expect(!verdict2)
        let verdict3 = d.check(now: t0 + .seconds(8) + .milliseconds(1250), waiting: true)

        #expect(!verdict3)
        let verdict4 = d.check(now: t0 + .seconds(8) + .milliseconds(2500), waiting: true)

        #expect(verdict4)
    }

    @Test func theClockStartsAtTheFirstCommandAfterAQuietSpell() {
        var d = deadline()
        d.sent(now: t0, idle: true)
        d.replied(now: t0 + .milliseconds(2))
        _ = d.check(now: t0 + .seconds(9), waiting: false)
        d.sent(now: t0 + .seconds(10), idle: true)
        let verdict5 = d.check(now: t0 + .seconds(10) + .milliseconds(100), waiting: true)

        #expect(!verdict5)
        // Not from the last reply, 10 s before.
        let found = checks(&d, from: .seconds(11), to: .seconds(20))
        #expect(found == .seconds(16))
    }
}
