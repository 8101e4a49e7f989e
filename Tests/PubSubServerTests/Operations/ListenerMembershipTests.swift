import Testing

@testable import PubSubServer

/// The membership of a listener in a shared port, without sockets: when it leaves, when it joins again.
@Suite struct ListenerMembershipTests {
    @Test func onlyWithASharedPortAndALimit() {
        #expect(ListenerMembership(limit: 0, sharedPort: true) == nil)
        #expect(ListenerMembership(limit: 100, sharedPort: false) == nil)
        #expect(ListenerMembership(limit: 100, sharedPort: true) != nil)
    }

    @Test func leavesNearTheLimitAndJoinsAgainLower() throws {
        var m = try #require(ListenerMembership(limit: 19_000, sharedPort: true))
        #expect(m.leaveAt == 19_000 - 296)
        #expect(m.rejoinAt == m.leaveAt - 296)
        #expect(m.opened(open: m.leaveAt - 1) == .none)
        #expect(m.opened(open: m.leaveAt) == .leave)
        #expect(m.opened(open: m.leaveAt + 1) == .none, "asked once")
        #expect(m.closed(open: m.rejoinAt) == .none, "not before the listener is closed")
        #expect(m.left(open: m.rejoinAt + 1) == .none)
        #expect(m.phase == .away)
        #expect(
            m.closed(open: m.rejoinAt + 1) == .none, "the gap keeps it from leaving and joining on every connection")
        #expect(m.closed(open: m.rejoinAt) == .join)
        #expect(m.closed(open: m.rejoinAt - 1) == .none, "asked once")
        #expect(m.joined(bound: true, open: m.rejoinAt) == .none)
        #expect(m.phase == .member)
        #expect(m.opened(open: m.leaveAt) == .leave, "and again")
    }

    @Test func connectionsThatClosedWhileLeavingJoinAtOnce() throws {
        var m = try #require(ListenerMembership(limit: 10, sharedPort: true))
        #expect(m.leaveAt == 9 && m.rejoinAt == 8)
        #expect(m.opened(open: 9) == .leave)
        #expect(m.closed(open: 8) == .none)
        #expect(m.left(open: 5) == .join)
    }

    @Test func connectionsThatOpenedWhileJoiningLeaveAtOnce() throws {
        var m = try #require(ListenerMembership(limit: 10, sharedPort: true))
        _ = m.opened(open: 9)
        _ = m.left(open: 8)
        #expect(m.phase == .joining)
        #expect(m.joined(bound: true, open: 9) == .leave)
    }

    @Test func aFailedBindTriesAgainAtTheNextClose() throws {
        var m = try #require(ListenerMembership(limit: 10, sharedPort: true))
        _ = m.opened(open: 9)
        #expect(m.left(open: 8) == .join)
        #expect(m.joined(bound: false, open: 8) == .none)
        #expect(m.phase == .away)
        #expect(m.closed(open: 7) == .join)
    }

    @Test func aDrainNeverJoinsAgain() throws {
        var m = try #require(ListenerMembership(limit: 10, sharedPort: true))
        _ = m.opened(open: 9)
        m.stop()
        #expect(m.left(open: 0) == .none)
        #expect(m.closed(open: 0) == .none)
        #expect(m.opened(open: 9) == .none)
    }

    @Test func aTinyLimitStillLeavesBeforeItIsFull() throws {
        let m = try #require(ListenerMembership(limit: 1, sharedPort: true))
        #expect(m.leaveAt == 1 && m.rejoinAt == 0)
    }
}
