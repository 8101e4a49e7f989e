import NIOCore
import Testing

@testable import PubSubRedis

/// The Redis engine's phases, driven without sockets.
@Suite struct RedisEngineStateMachineTests {
    typealias Machine = RedisEngineStateMachine
    let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)

    func event(_ sequence: UInt64) -> NodeMessage {
        .event(sequence: sequence, channel: "/a", event: ByteBuffer(string: "e\(sequence)"))
    }

    /// Both connections up, routed, subscribed: the first fill runs; returns its number.
    func filling(_ m: inout Machine) -> UInt64 {
        #expect(m.commandsConnected() == .route(after: nil))
        #expect(m.notificationsConnected() == .subscribe)
        #expect(m.notificationsSubscribed() == .none)
        guard case .fill(let fill) = m.routingDone() else {
            Issue.record("expected a fill")
            return 0
        }
        return fill
    }

    func serving() -> Machine {
        var m = Machine()
        let fill = filling(&m)
        _ = m.fillFinished(fill, .init())
        #expect(m.isServing)
        return m
    }

    @Test func startsConnectingAndServesOnlyAfterRoutingSubscriptionAndFill() {
        var m = Machine()
        #expect(m.phase == .connecting(.init(subscribed: false)))
        #expect(!m.isServing && !m.isSubscribed)
        #expect(m.commandsConnected() == .route(after: nil))
        #expect(m.routingDone() == .none)
        #expect(m.phase == .routed(.init(subscribed: false)))
        #expect(m.notificationsConnected() == .subscribe)
        #expect(m.notificationsSubscribed() == .fill(1))
        #expect(!m.isServing && m.isSubscribed)
        #expect(m.fillFinished(1, .init()) == .resume(buffered: [], found: .init(), sessionsAtCut: []))
        #expect(m.isServing)
        #expect(m.received(event(1)) == .deliver([event(1)]))
    }

    @Test func subscribedBeforeRoutingFillsWhenRoutingIsDone() {
        var m = Machine()
        #expect(m.notificationsSubscribed() == .none)
        #expect(m.commandsConnected() == .route(after: nil))
        #expect(m.phase == .routing(.init(subscribed: true)))
        #expect(m.routingDone() == .fill(1))
    }

    @Test func notificationsBufferedDuringAFillComeOutInOrderAfterIt() {
        var m = Machine()
        #expect(m.received(event(1)) == .none)  // before routing: held too
        let fill = filling(&m)
        for n in 2...5 { #expect(m.received(event(UInt64(n))) == .none) }
        #expect(m.received(.barrier(7)) == .none)
        let found = Machine.FillOutcome(recovered: 3, missed: 0, lostData: false)
        #expect(
            m.fillFinished(fill, found)
                == .resume(buffered: (1...5).map { event($0) } + [.barrier(7)], found: found, sessionsAtCut: []))
        #expect(m.received(event(6)) == .deliver([event(6)]))
    }

    @Test func aFailedFillIsRetriedAndKeepsWhatItHeld() {
        var m = Machine()
        let fill = filling(&m)
        _ = m.received(event(1))
        #expect(m.fillFinished(fill, nil) == .scheduleFill)
        #expect(!m.isServing)
        _ = m.received(event(2))
        guard case .fill(let again) = m.fillDue() else {
            Issue.record("expected a fill")
            return
        }
        #expect(again != fill)
        #expect(
            m.fillFinished(again, .init())
                == .resume(buffered: [event(1), event(2)], found: .init(), sessionsAtCut: []))
    }

    @Test func aCutDuringAFillStartsItAgainOnceSubscribed() {
        var m = Machine()
        let fill = filling(&m)
        _ = m.received(event(1))
        #expect(m.notificationsCut(resident: ["c1"]) == .notificationsLost)
        #expect(!m.isSubscribed)
        // The read that ran cannot end the fill: what was published until the new subscription may lie after it.
        let early = Machine.FillOutcome(recovered: 1, missed: 2, lostData: false)
        #expect(m.fillFinished(fill, early) == .none)
        #expect(!m.isServing)
        #expect(m.fillDue() == .none)  // not subscribed: nothing to retry yet
        #expect(m.notificationsConnected() == .subscribe)
        guard case .fill(let again) = m.notificationsSubscribed() else {
            Issue.record("expected a fill")
            return
        }
        #expect(again != fill)
        _ = m.received(event(2))
        // What the first read found is told with the second: no gap goes untold.
        #expect(
            m.fillFinished(again, .init(recovered: 1))
                == .resume(
                    buffered: [event(1), event(2)], found: .init(recovered: 2, missed: 2, lostData: false),
                    sessionsAtCut: ["c1"]))
    }

    @Test func aCutAndResubscriptionDuringAFillMakeItsResultStale() {
        var m = Machine()
        let fill = filling(&m)
        _ = m.notificationsCut(resident: [])
        guard case .fill(let again) = m.notificationsSubscribed() else {
            Issue.record("expected a fill")
            return
        }
        #expect(m.fillFinished(fill, .init()) == .none)
        #expect(!m.isServing)
        #expect(m.fillFinished(again, .init()) == .resume(buffered: [], found: .init(), sessionsAtCut: []))
    }

    @Test func theSessionsOfTheFirstCutAreKeptUntilAFillEnds() {
        var m = serving()
        #expect(m.notificationsCut(resident: ["a", "b"]) == .notificationsLost)
        #expect(m.notificationsCut(resident: ["a", "b", "c"]) == .notificationsLost)
        guard case .fill(let fill) = m.notificationsSubscribed() else {
            Issue.record("expected a fill")
            return
        }
        let gap = Machine.FillOutcome(recovered: 0, missed: 4, lostData: false)
        #expect(m.fillFinished(fill, gap) == .resume(buffered: [], found: gap, sessionsAtCut: ["a", "b"]))
        // The next cut starts afresh.
        _ = m.notificationsCut(resident: ["d"])
        guard case .fill(let next) = m.notificationsSubscribed() else {
            Issue.record("expected a fill")
            return
        }
        #expect(m.fillFinished(next, .init()) == .resume(buffered: [], found: .init(), sessionsAtCut: ["d"]))
    }

    @Test func anOutageIsTimedAndCountsLocalPublishesUntilRedisIsBack() {
        var m = serving()
        m.publishedLocally()  // not in an outage: nothing to count
        #expect(m.commandsLost(now: t0, resident: []) == .outageBegan)
        #expect(m.outage == .init(since: t0, localPublishes: 0))
        #expect(!m.isServing && m.isSubscribed)
        m.publishedLocally()
        m.publishedLocally()
        // Notifications still arriving are held until routing and the fill are done again.
        #expect(m.received(event(1)) == .none)
        #expect(m.commandsConnected() == .route(after: .init(since: t0, localPublishes: 2)))
        #expect(m.outage == nil)
        #expect(m.routingDone() == .fill(2))
        #expect(m.fillFinished(2, .init()) == .resume(buffered: [event(1)], found: .init(), sessionsAtCut: []))
    }

    /// Redis cut off entirely (the command connection lost first): the sessions there then are the ones told of
    /// a gap the read finds once it is back, as after a cut of the notifications alone.
    @Test func theSessionsWhenTheCommandsWereLostAreToldOfAGap() {
        var m = serving()
        #expect(m.commandsLost(now: t0, resident: ["a"]) == .outageBegan)
        _ = m.notificationsCut(resident: ["a", "b"])
        #expect(m.commandsConnected() == .route(after: .init(since: t0)))
        #expect(m.routingDone() == .none)
        #expect(m.notificationsConnected() == .subscribe)
        guard case .fill(let fill) = m.notificationsSubscribed() else {
            Issue.record("expected a fill")
            return
        }
        let gap = Machine.FillOutcome(recovered: 0, missed: 9, lostData: false)
        #expect(m.fillFinished(fill, gap) == .resume(buffered: [], found: gap, sessionsAtCut: ["a"]))
    }

    /// What a read gives back is handed out with the resume (after the gap is told), never as it is read; an
    /// abandoned read's events come first, in the order read.
    @Test func recoveredEventsWaitForTheResumeInTheOrderRead() {
        var m = Machine()
        let fill = filling(&m)
        _ = m.notificationsCut(resident: ["c1"])
        func recovered(_ n: Int) -> Machine.FillOutcome.Recovered {
            .init(channel: "/a", event: ByteBuffer(string: "\(n)"))
        }
        let early = Machine.FillOutcome(recovered: 2, events: [recovered(1), recovered(2)], missed: 5)
        #expect(m.fillFinished(fill, early) == .none)
        guard case .fill(let again) = m.notificationsSubscribed() else {
            Issue.record("expected a fill")
            return
        }
        let late = Machine.FillOutcome(recovered: 1, events: [recovered(3)])
        #expect(
            m.fillFinished(again, late)
                == .resume(
                    buffered: [],
                    found: .init(recovered: 3, events: [recovered(1), recovered(2), recovered(3)], missed: 5),
                    sessionsAtCut: ["c1"]))
    }

    @Test func aLossDuringAnOutageStartsItAgain() {
        var m = serving()
        _ = m.commandsLost(now: t0, resident: [])
        m.publishedLocally()
        let t1 = t0 + .seconds(1)
        #expect(m.commandsLost(now: t1, resident: []) == .outageBegan)
        #expect(m.commandsConnected() == .route(after: .init(since: t1, localPublishes: 0)))
    }

    @Test func anOutageDuringAFillOrRoutingHoldsUntilRoutedAgain() {
        var m = Machine()
        let fill = filling(&m)
        _ = m.received(event(1))
        #expect(m.commandsLost(now: t0, resident: []) == .outageBegan)
        #expect(m.fillFinished(fill, nil) == .none)
        #expect(m.routingDone() == .none)  // a routing of the lost connection
        #expect(m.commandsConnected() == .route(after: .init(since: t0)))
        #expect(m.commandsLost(now: t0, resident: []) == .outageBegan)  // lost again while routing
        #expect(m.commandsConnected() == .route(after: .init(since: t0)))
        guard case .fill(let again) = m.routingDone() else {
            Issue.record("expected a fill")
            return
        }
        #expect(m.fillFinished(again, .init()) == .resume(buffered: [event(1)], found: .init(), sessionsAtCut: []))
    }

    @Test func heldNotificationsAreBounded() {
        var m = Machine()
        for n in 0..<Machine.bufferLimit + 3 { _ = m.received(.barrier(UInt64(n))) }
        guard case .connecting(let held) = m.phase else {
            Issue.record("expected connecting")
            return
        }
        #expect(held.buffered.count == Machine.bufferLimit)
        #expect(held.buffered.last == .barrier(UInt64(Machine.bufferLimit - 1)))
    }

    @Test(arguments: ["connecting", "routing", "routed", "filling", "serving", "outage"])
    func closesFromEveryPhaseOnceAndThenIgnoresEvents(phase: String) {
        var m = Machine()
        switch phase {
        case "connecting":
            break
        case "routing":
            _ = m.commandsConnected()
        case "routed":
            _ = m.commandsConnected()
            _ = m.routingDone()
        case "filling":
            _ = filling(&m)
        case "serving":
            m = serving()
        default:
            m = serving()
            _ = m.commandsLost(now: t0, resident: [])
        }
        _ = m.received(event(1))
        #expect(m.close() == .close)
        #expect(m.phase == .closed)
        #expect(m.close() == .none)
        #expect(m.received(event(2)) == .none)
        #expect(m.notificationsConnected() == .none)
        #expect(m.notificationsSubscribed() == .none)
        #expect(m.notificationsCut(resident: ["a"]) == .none)
        #expect(m.commandsConnected() == .none)
        #expect(m.commandsLost(now: t0, resident: []) == .none)
        #expect(m.routingDone() == .none)
        #expect(m.fillDue() == .none)
        #expect(m.fillFinished(1, .init()) == .none)
        #expect(m.phase == .closed && !m.isServing && !m.isSubscribed)
    }
}
