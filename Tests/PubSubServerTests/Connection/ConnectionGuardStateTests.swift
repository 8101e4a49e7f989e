import NIOCore
import Testing

@testable import PubSubServer

/// Every timer path of the connection guard, driven without sockets: time is an input.
@Suite struct ConnectionGuardStateTests {
    static let timeouts = ConnectionTimeouts(
        header: .seconds(10), idle: .seconds(30), send: .seconds(30), lingerTime: .seconds(10),
        lingerReadTimeout: .seconds(2), lingerBytes: 1000)
    static let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    func at(_ seconds: Double) -> NIODeadline { Self.start + .nanoseconds(Int64(seconds * 1e9)) }

    func machine() -> ConnectionGuardState {
        ConnectionGuardState(timeouts: Self.timeouts, pingInterval: .seconds(30), now: Self.start)
    }

    // MARK: Reading while a response is awaited

    @Test func readsOnWhileAResponseIsAwaitedUntilBytesArrive() {
        var m = machine()
        #expect(!m.readsOnWhileAwaitingResponse)
        _ = m.bytesReceived(100, now: at(0))
        m.requestHead(now: at(0))
        #expect(!m.readsOnWhileAwaitingResponse, "the body is still arriving: the pipeline reads as usual")
        m.requestEnd(now: at(0))
        #expect(m.readsOnWhileAwaitingResponse)
        m.writabilityChanged(isWritable: false, now: at(1))
        #expect(!m.readsOnWhileAwaitingResponse, "reading waits while writes are blocked")
        m.writabilityChanged(isWritable: true, now: at(2))
        #expect(m.readsOnWhileAwaitingResponse)
        #expect(m.bytesReceived(10, now: at(3)) == .forward)
        #expect(!m.readsOnWhileAwaitingResponse, "a pipelined request stops the reading ahead")
        m.responseEnd(now: at(4))
        #expect(!m.readsOnWhileAwaitingResponse, "no request in flight")
        m.requestHead(now: at(4))
        m.requestEnd(now: at(4))
        #expect(m.readsOnWhileAwaitingResponse, "the next request reads ahead again")
    }

    // MARK: Header timeout

    @Test func silentConnectionIsClosedAtTheHeaderTimeoutFromItsStart() {
        var m = machine()
        #expect(m.deadline == at(10))
        #expect(m.timerFired(now: at(9.9)) == .none)
        #expect(m.timerFired(now: at(10)) == .close(.headerTimeout))
        #expect(m.phase == .closed)
        #expect(m.deadline == nil)
    }

    @Test func firstHeadIsTimedFromTheConnectionStartNotItsFirstByte() {
        var m = machine()
        #expect(m.bytesReceived(5, now: at(8)) == .forward)
        #expect(m.deadline == at(10))
        #expect(m.timerFired(now: at(10)) == .close(.headerTimeout))
    }

    @Test func byteAtATimeHeaderIsClosedAtTheDeadlineWhateverItsPace() {
        var m = machine()
        var t = 0.0
        while t < 10 {
            #expect(m.bytesReceived(1, now: at(t)) == .forward)
            #expect(m.deadline == at(10), "a byte must not push the header deadline back")
            #expect(m.timerFired(now: at(t)) == .none)
            t += 0.5
        }
        #expect(m.timerFired(now: at(10)) == .close(.headerTimeout))
    }

    @Test func headCompleteInTimeStopsTheHeaderTimer() {
        var m = machine()
        _ = m.bytesReceived(100, now: at(1))
        m.requestHead(now: at(2))
        m.requestEnd(now: at(2))
        #expect(m.deadline == nil)
        #expect(m.timerFired(now: at(100)) == .none)
        #expect(m.phase != .closed)
    }

    @Test func laterHeadIsTimedFromItsFirstByte() {
        var m = machine()
        m.requestHead(now: at(1))
        m.requestEnd(now: at(1))
        m.responseEnd(now: at(2))
        _ = m.bytesReceived(3, now: at(20))
        #expect(m.deadline == at(30))
        #expect(m.timerFired(now: at(29)) == .none)
        #expect(m.timerFired(now: at(30)) == .close(.headerTimeout))
    }

    // MARK: Idle timeout

    @Test func keepAliveConnectionWithNoRequestIsClosedAtTheIdleTimeout() {
        var m = machine()
        m.requestHead(now: at(1))
        m.requestEnd(now: at(1))
        m.responseEnd(now: at(5))
        #expect(m.deadline == at(35))
        #expect(m.timerFired(now: at(34)) == .none)
        #expect(m.timerFired(now: at(35)) == .close(.idleTimeout))
    }

    @Test func eachRequestStartsTheIdleTimeoutAgain() {
        var m = machine()
        for i in 0..<5 {
            let t = Double(i) * 25
            _ = m.bytesReceived(50, now: at(t))
            m.requestHead(now: at(t))
            m.requestEnd(now: at(t))
            m.responseEnd(now: at(t + 1))
            #expect(m.timerFired(now: at(t + 25)) == .none)
        }
        #expect(m.timerFired(now: at(4 * 25 + 1 + 30)) == .close(.idleTimeout))
    }

    @Test func parkedLongPollIsNeverCut() {
        // A /meta/connect held for its whole --timeout (and longer): a request in flight, no deadline.
        var m = machine()
        _ = m.bytesReceived(200, now: at(0.1))
        m.requestHead(now: at(0.1))
        m.requestEnd(now: at(0.1))
        #expect(m.deadline == nil)
        for t in stride(from: 10.0, through: 3600, by: 10) { #expect(m.timerFired(now: at(t)) == .none) }
        m.responseEnd(now: at(3600))
        #expect(m.deadline == at(3630))
    }

    @Test func openEventSourceIsNeverCutEvenWhenTheClientSendsNothing() {
        var m = machine()
        m.requestHead(now: at(0))
        m.requestEnd(now: at(0))
        // Events written (writable all along), no response end.
        #expect(m.timerFired(now: at(10_000)) == .none)
        #expect(m.phase == .request(bodyComplete: true, responded: false, lastRead: at(0)))
    }

    @Test func slowBodyIsBoundedByTheIdleTimeoutBetweenReads() {
        var m = machine()
        m.requestHead(now: at(0))
        _ = m.bytesReceived(10, now: at(20))
        #expect(m.deadline == at(50))
        #expect(m.timerFired(now: at(30)) == .none)  // 30 s after the head, but only 10 s after the last read
        #expect(m.timerFired(now: at(50)) == .close(.bodyTimeout))
    }

    @Test func responseStillGoingOutToASlowReaderIsNotIdle() {
        var m = machine()
        m.requestHead(now: at(0))
        m.requestEnd(now: at(0))
        m.responseEnd(now: at(0))
        // 3 MB written, going out slowly but steadily.
        #expect(m.timerFired(now: at(30), unsentBytes: 3_000_000) == .none)
        #expect(m.deadline == at(60))
        #expect(m.timerFired(now: at(60), unsentBytes: 1_000_000) == .none)
        #expect(m.deadline == at(90))
        // All sent: idle from here it is (its idle time was spent already).
        #expect(m.timerFired(now: at(90), unsentBytes: 0) == .close(.idleTimeout))
    }

    @Test func responseThatStopsGoingOutIsClosedAtTheSendTimeout() {
        var m = machine()
        m.requestHead(now: at(0))
        m.requestEnd(now: at(0))
        m.responseEnd(now: at(0))
        #expect(m.timerFired(now: at(30), unsentBytes: 40_000) == .none)
        #expect(m.timerFired(now: at(60), unsentBytes: 40_000) == .close(.sendTimeout))
    }

    // MARK: Send timeout

    @Test func writesBlockedForTheSendTimeoutClose() {
        var m = machine()
        m.requestHead(now: at(0))
        m.requestEnd(now: at(0))
        m.writabilityChanged(isWritable: false, now: at(1))
        #expect(m.deadline == at(31))
        #expect(m.timerFired(now: at(30)) == .none)
        #expect(m.timerFired(now: at(31)) == .close(.sendTimeout))
    }

    @Test func writesThatDrainInTimeKeepTheConnection() {
        var m = machine()
        m.requestHead(now: at(0))
        m.requestEnd(now: at(0))
        m.writabilityChanged(isWritable: false, now: at(1))
        m.writabilityChanged(isWritable: true, now: at(20))
        m.writabilityChanged(isWritable: false, now: at(25))
        #expect(m.timerFired(now: at(31)) == .none)
        #expect(m.deadline == at(55))
        #expect(m.timerFired(now: at(55)) == .close(.sendTimeout))
    }

    @Test func slowButSteadyReaderIsNotCutBySendTimeout() {
        var m = machine()
        m.requestHead(now: at(0))
        m.requestEnd(now: at(0))
        m.writabilityChanged(isWritable: false, unsentBytes: 2_000_000, now: at(0))
        #expect(m.timerFired(now: at(30), unsentBytes: 1_200_000) == .none)
        #expect(m.deadline == at(60))
        #expect(m.timerFired(now: at(60), unsentBytes: 400_000) == .none)
        // Then it stops reading.
        #expect(m.timerFired(now: at(90), unsentBytes: 400_000) == .close(.sendTimeout))
    }

    @Test func sendTimeoutAppliesToWebSocketsToo() {
        var m = machine()
        m.upgraded(now: at(0))
        m.writabilityChanged(isWritable: false, now: at(0))
        // The peer keeps sending (so pings are not due) but never reads.
        for t in stride(from: 1.0, to: 30, by: 1) {
            _ = m.bytesReceived(10, now: at(t))
            #expect(m.timerFired(now: at(t)) == .none)
        }
        #expect(m.timerFired(now: at(30)) == .close(.sendTimeout))
    }

    /// A reader that stopped under the write buffer's water mark: the channel stays writable, but bytes stay
    /// pending; the send timeout applies to them, a reader that takes some gets another, and one that took all
    /// of them is blocked no more.
    @Test func bytesPendingOnAWritableWebSocketStartTheSendTimeout() {
        var m = machine()
        m.upgraded(now: at(0))
        m.writesPending(unsentBytes: 0, now: at(0))
        #expect(m.blockedSince == nil, "nothing pending: nothing timed")
        m.writesPending(unsentBytes: 5_000, now: at(1))
        // The peer keeps sending (no ping is due) all along.
        _ = m.bytesReceived(10, now: at(20))
        #expect(m.deadline == at(1 + 30))
        #expect(m.timerFired(now: at(31), unsentBytes: 4_000) == .none, "some went out: another send timeout")
        _ = m.bytesReceived(10, now: at(50))
        #expect(m.timerFired(now: at(61), unsentBytes: 0) == .none, "all went out")
        #expect(m.blockedSince == nil)
        m.writesPending(unsentBytes: 3_000, now: at(70))
        _ = m.bytesReceived(10, now: at(90))
        #expect(m.timerFired(now: at(100), unsentBytes: 3_000) == .close(.sendTimeout))
    }

    // MARK: WebSocket pings

    @Test func silentWebSocketIsPingedThenClosedAfterTwoIntervals() {
        var m = machine()
        _ = m.bytesReceived(300, now: at(0))
        m.requestHead(now: at(0))
        m.requestEnd(now: at(0))
        m.upgraded(now: at(0))
        #expect(m.deadline == at(30))
        #expect(m.timerFired(now: at(29)) == .none)
        #expect(m.timerFired(now: at(30)) == .ping)
        #expect(m.deadline == at(60))
        #expect(m.timerFired(now: at(45)) == .none, "one ping per silence")
        #expect(m.timerFired(now: at(60)) == .close(.pingTimeout))
    }

    @Test func pongKeepsAWebSocketAliveForEver() {
        var m = machine()
        m.upgraded(now: at(0))
        var now = at(0)
        for _ in 0..<100 {
            guard let deadline = m.deadline else {
                Issue.record("no deadline on a WebSocket")
                return
            }
            now = deadline
            #expect(m.timerFired(now: now) == .ping)
            // The pong arrives a moment later.
            #expect(m.bytesReceived(2, now: now + .milliseconds(50)) == .forward)
        }
        #expect(m.phase == .webSocket(lastReceived: now + .milliseconds(50), pinged: false))
    }

    @Test func framesFromTheClientMakePingsUnneeded() {
        var m = machine()
        m.upgraded(now: at(0))
        for t in stride(from: 20.0, through: 400, by: 20) {
            _ = m.bytesReceived(40, now: at(t))
            #expect(m.timerFired(now: at(t)) == .none)
        }
    }

    @Test func webSocketIsNotSubjectToHeaderOrIdleTimeouts() {
        var m = machine()
        m.requestHead(now: at(0))
        m.requestEnd(now: at(0))
        m.upgraded(now: at(0))
        // HTTP events after the upgrade change nothing.
        m.responseEnd(now: at(1))
        m.requestHead(now: at(1))
        #expect(m.deadline == at(30))
        #expect(m.timerFired(now: at(10)) == .none)
    }

    // MARK: Lingering close

    @Test func closeWithAHalfReadBodyLingers() {
        var m = machine()
        m.requestHead(now: at(0))
        _ = m.bytesReceived(500, now: at(0))
        m.responseEnd(now: at(0))  // a 413, sent before the body is read
        #expect(m.closeRequested(now: at(0)) == .linger)
        #expect(m.isLingering)
        #expect(m.closeRequested(now: at(0)) == .alreadyClosing)
        #expect(m.bytesReceived(400, now: at(1)) == .discard)
        #expect(m.bytesReceived(500, now: at(1.5)) == .discard)
        #expect(m.deadline == at(3.5))
    }

    @Test func closeWithAHalfReadHeadLingers() {
        var m = machine()
        _ = m.bytesReceived(5, now: at(0))
        #expect(m.closeRequested(now: at(0)) == .linger)
    }

    @Test func closeAfterACompleteRequestDoesNotLinger() {
        var m = machine()
        m.requestHead(now: at(0))
        m.requestEnd(now: at(0))
        m.responseEnd(now: at(0))
        #expect(m.closeRequested(now: at(0)) == .closeNow)
        var idle = machine()
        #expect(idle.closeRequested(now: at(0)) == .closeNow)
        var ws = machine()
        ws.upgraded(now: at(0))
        #expect(ws.closeRequested(now: at(0)) == .closeNow)
    }

    @Test func lingeringIsBoundedByBytes() {
        var m = machine()
        m.requestHead(now: at(0))
        #expect(m.closeRequested(now: at(0)) == .linger)
        #expect(m.bytesReceived(600, now: at(0.1)) == .discard)
        #expect(m.bytesReceived(400, now: at(0.2)) == .discard)  // exactly the limit
        #expect(m.bytesReceived(1, now: at(0.3)) == .close(.lingerOverflow))
        #expect(m.phase == .closed)
    }

    @Test func lingeringIsBoundedByTimeBetweenReads() {
        var m = machine()
        m.requestHead(now: at(0))
        _ = m.closeRequested(now: at(0))
        _ = m.bytesReceived(10, now: at(1))
        #expect(m.timerFired(now: at(2.9)) == .none)
        #expect(m.timerFired(now: at(3)) == .close(.lingerDone))
    }

    @Test func lingeringIsBoundedByTimeInAll() {
        var m = machine()
        m.requestHead(now: at(0))
        _ = m.closeRequested(now: at(0))
        var t = 0.0
        while t < 10 {
            #expect(m.bytesReceived(1, now: at(t)) == .discard)
            #expect(m.timerFired(now: at(t)) == .none)
            t += 1
        }
        #expect(m.deadline == at(10))
        #expect(m.timerFired(now: at(10)) == .close(.lingerDone))
    }

    @Test func lingeringIsNotCutBySendOrIdleTimeouts() {
        var m = machine()
        m.requestHead(now: at(0))
        m.writabilityChanged(isWritable: false, now: at(0))
        _ = m.closeRequested(now: at(25))
        _ = m.bytesReceived(1, now: at(30))
        #expect(m.timerFired(now: at(31)) == .none)
        #expect(m.timerFired(now: at(32)) == .close(.lingerDone))
    }

    @Test func closedConnectionHasNothingDue() {
        var m = machine()
        m.writabilityChanged(isWritable: false, now: at(0))
        m.closed()
        #expect(m.deadline == nil)
        #expect(m.bytesReceived(10, now: at(1)) == .discard)
        #expect(m.timerFired(now: at(1000)) == .none)
    }
}
