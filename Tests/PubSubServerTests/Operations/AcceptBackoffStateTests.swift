import NIOCore
import Testing

@testable import PubSubServer

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// What a listener does when `accept` fails, driven without sockets: time is an input.
@Suite struct AcceptBackoffStateTests {
    static let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    func at(_ seconds: Double) -> NIODeadline { Self.start + .nanoseconds(Int64(seconds * 1e9)) }

    func machine(reserve: Bool = true) -> AcceptBackoffState {
        AcceptBackoffState(reserveOpened: reserve, now: Self.start)
    }

    @Test func errnoValuesAreClassified() {
        #expect(AcceptBackoffState.Failure(errno: EMFILE) == .descriptors)
        #expect(AcceptBackoffState.Failure(errno: ENFILE) == .descriptors)
        #expect(AcceptBackoffState.Failure(errno: ENOBUFS) == .memory)
        #expect(AcceptBackoffState.Failure(errno: ENOMEM) == .memory)
        // One connection gone before it was accepted: the next accept goes on.
        #expect(AcceptBackoffState.Failure(errno: ECONNABORTED) == nil)
    }

    @Test func quietListenerHasNothingDue() {
        let m = machine()
        #expect(m.reserve == .held)
        #expect(m.deadline == nil)
        #expect(!m.inBurst)
    }

    // MARK: The reserve descriptor

    @Test func firstDescriptorFailureReleasesTheReserveWithoutPausingAndShedsTheNextConnection() {
        var m = machine()
        let failed = m.acceptFailed(.descriptors, now: at(0))
        #expect(failed == .init(releaseReserve: true, pause: false, report: .began(.descriptors)))
        #expect(m.reserve == .released)
        let r1 = m.accepted(now: at(0))
        #expect(r1 == .shed)
        #expect(m.reserve == .lent)
    }

    @Test func failureWhileTheReserveIsLentPausesWithADoublingBackoff() {
        var m = machine()
        _ = m.acceptFailed(.descriptors, now: at(0))
        _ = m.accepted(now: at(0))
        let first = m.acceptFailed(.descriptors, now: at(0))
        #expect(first == .init(releaseReserve: false, pause: true, report: nil))
        #expect(m.pausedUntil == at(0.02))
        let r2 = m.timerFired(now: at(0.019))
        #expect(r2.resume == false)
        let r3 = m.timerFired(now: at(0.02))
        #expect(r3.resume == true)
        #expect(m.pausedUntil == nil)
        // Each failure after a resume waits twice as long, up to a second.
        var expected = 0.04
        var now = 0.02
        for _ in 0..<8 {
            let action = m.acceptFailed(.descriptors, now: at(now))
            #expect(action.pause)
            #expect(m.pausedUntil == at(now + min(1, expected)))
            now += min(1, expected)
            let r4 = m.timerFired(now: at(now))
            #expect(r4.resume)
            expected *= 2
        }
        #expect(m.delay == .seconds(1))
    }

    @Test func aFailureWhilePausedDoesNotPauseTwice() {
        var m = machine(reserve: false)
        let r5 = m.acceptFailed(.memory, now: at(0))
        #expect(r5.pause)
        let r6 = m.acceptFailed(.memory, now: at(0.001))
        #expect(!r6.pause)
    }

    @Test func theShedConnectionClosingBringsTheReserveBackAndResumesAtOnce() {
        var m = machine()
        _ = m.acceptFailed(.descriptors, now: at(0))
        _ = m.accepted(now: at(0))
        _ = m.acceptFailed(.descriptors, now: at(0.001))
        #expect(m.pausedUntil != nil)
        let r7 = m.reserveReturned(reopened: true, now: at(0.005))
        #expect(r7)
        #expect(m.reserve == .held)
        #expect(m.pausedUntil == nil)
        // The next failure sheds again at once.
        let r8 = m.acceptFailed(.descriptors, now: at(0.006))
        #expect(r8.releaseReserve)
        let r9 = m.accepted(now: at(0.006))
        #expect(r9 == .shed)
    }

    @Test func theShedConnectionClosingWithoutAPauseDoesNotAskToResume() {
        var m = machine()
        _ = m.acceptFailed(.descriptors, now: at(0))
        _ = m.accepted(now: at(0))
        let r10 = m.reserveReturned(reopened: true, now: at(0.1))
        #expect(!r10)
        #expect(m.reserve == .held)
    }

    @Test func aConnectionAcceptedWhenTheReserveReopensWasNotAtTheCeilingAndIsAdmitted() {
        var m = machine()
        _ = m.acceptFailed(.descriptors, now: at(0))
        // Some descriptor closed between the failure and the accept: the reserve opens again beside it.
        let r11 = m.accepted(now: at(0), reserveReopened: true)
        #expect(r11 == .admit)
        #expect(m.reserve == .held)
        #expect(m.delay == nil)
    }

    @Test func aReserveThatCannotBeReopenedIsRetriedOnTheTimer() {
        var m = machine()
        _ = m.acceptFailed(.descriptors, now: at(0))
        _ = m.accepted(now: at(0))
        _ = m.acceptFailed(.descriptors, now: at(0))
        let r12 = m.reserveReturned(reopened: false, now: at(0.01))
        #expect(!r12)
        #expect(m.reserve == .missing)
        #expect(m.reserveRetryAt == at(1.01))
        _ = m.timerFired(now: at(0.02))  // the pause ends; the reserve is not due yet
        let due = m.timerFired(now: at(1.01))
        #expect(due.reopenReserve)
        let r13 = m.reserveReopened(true, now: at(1.01))
        #expect(!r13)  // not paused: nothing to resume
        #expect(m.reserve == .held)
        #expect(m.reserveRetryAt == nil)
    }

    @Test func aReserveThatCouldNotBeOpenedAtStartIsRetriedAndResumesAPausedListener() {
        var m = machine(reserve: false)
        #expect(m.reserve == .missing)
        #expect(m.deadline == at(1))
        let failed = m.acceptFailed(.descriptors, now: at(0.5))
        #expect(!failed.releaseReserve)
        #expect(failed.pause)
        let r14 = m.timerFired(now: at(0.52))
        #expect(r14.resume)
        _ = m.acceptFailed(.descriptors, now: at(0.99))
        let r15 = m.timerFired(now: at(1))
        #expect(r15.reopenReserve)
        let r16 = m.reserveReopened(true, now: at(1))
        #expect(r16)
        #expect(m.reserve == .held)
    }

    @Test func theReleasedSlotTakenBeforeTheAcceptCountsTheReserveAsMissing() {
        var m = machine()
        _ = m.acceptFailed(.descriptors, now: at(0))
        let again = m.acceptFailed(.descriptors, now: at(0))
        #expect(!again.releaseReserve)
        #expect(again.pause)
        #expect(m.reserve == .missing)
    }

    @Test func memoryFailuresNeverTouchTheReserve() {
        var m = machine()
        let failed = m.acceptFailed(.memory, now: at(0))
        #expect(failed == .init(releaseReserve: false, pause: true, report: .began(.memory)))
        #expect(m.reserve == .held)
    }

    @Test func aNormalAcceptResetsTheBackoff() {
        var m = machine(reserve: false)
        _ = m.acceptFailed(.memory, now: at(0))
        _ = m.timerFired(now: at(0.02))
        _ = m.acceptFailed(.memory, now: at(0.02))
        #expect(m.delay == .milliseconds(40))
        let r17 = m.accepted(now: at(0.1))
        #expect(r17 == .admit)
        #expect(m.delay == nil)
        _ = m.acceptFailed(.memory, now: at(0.2))
        #expect(m.pausedUntil == at(0.22))
    }

    // MARK: Reports: once per burst

    @Test func aBurstIsReportedWhenItBeginsEveryIntervalWhileItLastsAndWhenItEnds() {
        var m = machine()
        let r18 = m.acceptFailed(.descriptors, now: at(0))
        #expect(r18.report == .began(.descriptors))
        let r19 = m.accepted(now: at(0))
        #expect(r19 == .shed)
        var reports: [AcceptBackoffState.Report] = []
        // A failure every 100 ms for 25 s: two reports on the way, not 250 lines.
        for i in 1..<250 {
            let t = Double(i) / 10
            if let report = m.acceptFailed(.descriptors, now: at(t)).report { reports.append(report) }
            if let report = m.timerFired(now: at(t + 0.05)).report { reports.append(report) }
        }
        let last = 24.9
        #expect(reports.count == 2)
        guard case .continuing(let failures, let shed) = reports.first else {
            Issue.record("expected a continuing report, got \(reports)")
            return
        }
        #expect(failures == 100)
        #expect(shed == 1)
        #expect(m.inBurst)
        // Quiet for the quiet period: the end, with the burst's totals.
        #expect(m.deadline != nil)
        let r20 = m.timerFired(now: at(last + 1.9))
        #expect(r20.report == nil)
        let end = m.timerFired(now: at(last + 2))
        guard case .ended(let total, let totalShed, let lasted) = end.report else {
            Issue.record("expected the end of the burst, got \(String(describing: end.report))")
            return
        }
        #expect(total == 250)
        #expect(totalShed == 1)
        #expect(abs(Double(lasted.nanoseconds) / 1e9 - last) < 0.001)
        #expect(!m.inBurst)
        #expect(m.deadline == nil)
        // The next failure begins a new burst.
        let r21 = m.acceptFailed(.descriptors, now: at(last + 60))
        #expect(r21.report == .began(.descriptors))
    }

    @Test func aReportIsDueOnTheTimerEvenWithoutAnotherFailure() {
        var settings = AcceptBackoffState.Settings()
        settings.quietPeriod = .seconds(30)
        var m = AcceptBackoffState(settings: settings, reserveOpened: true, now: Self.start)
        _ = m.acceptFailed(.descriptors, now: at(0))
        _ = m.accepted(now: at(0))
        _ = m.acceptFailed(.descriptors, now: at(1))
        _ = m.acceptFailed(.descriptors, now: at(2))
        // Something new since the first report (two failures, the shed connection): one is due at its interval.
        // Paused at 1 for 20 ms; the failure at 2 (still paused) doubles the delay: 40 ms from then.
        #expect(m.deadline == at(2.04))
        let r22 = m.timerFired(now: at(2.04))
        #expect(r22.resume)
        #expect(m.deadline == at(10))
        let r23 = m.timerFired(now: at(10))
        #expect(r23.report == .continuing(failures: 2, shed: 1))
        // Nothing new: no report, and only the end of the burst is due.
        #expect(m.deadline == at(32))
        let r24 = m.timerFired(now: at(20))
        #expect(r24.report == nil)
        let r25 = m.timerFired(now: at(32))
        #expect(r25.report == .ended(failures: 3, shed: 1, lasted: .seconds(2)))
    }
}
