import NIOCore
import NIOEmbedded
import Testing

@testable import PubSubServer

/// A deadline owner that records when it was told its deadline came.
private final class Owner: TimerQueueOwner {
    let name: String
    var timerQueueIndex = -1
    var fired: [NIODeadline] = []
    var onFire: (() -> Void)?
    var clock: (() -> NIODeadline)?

    init(_ name: String) { self.name = name }

    func timerQueueDeadlineReached() {
        fired.append(clock?() ?? .uptimeNanoseconds(0))
        onFire?()
    }
}

private func at(_ ms: Int64) -> NIODeadline { .uptimeNanoseconds(UInt64(ms) * 1_000_000) }

@Suite struct TimerQueueTests {
    @Test func popsInDeadlineOrderOnlyWhenDue() {
        var queue = TimerQueue()
        let a = Owner("a")
        let b = Owner("b")
        let c = Owner("c")
        queue.schedule(b, at: at(20))
        queue.schedule(c, at: at(30))
        queue.schedule(a, at: at(10))
        #expect(queue.earliest == at(10))
        #expect(queue.popDue(now: at(9)) == nil)
        #expect((queue.popDue(now: at(25)) as? Owner)?.name == "a")
        #expect((queue.popDue(now: at(25)) as? Owner)?.name == "b")
        #expect(queue.popDue(now: at(25)) == nil)
        #expect(queue.earliest == at(30))
        #expect((queue.popDue(now: at(30)) as? Owner)?.name == "c")
        #expect(queue.isEmpty)
        #expect(a.timerQueueIndex == -1 && b.timerQueueIndex == -1 && c.timerQueueIndex == -1)
    }

    @Test func schedulingAgainMovesTheOneEntry() {
        var queue = TimerQueue()
        let a = Owner("a")
        let b = Owner("b")
        queue.schedule(a, at: at(10))
        queue.schedule(b, at: at(20))
        queue.schedule(a, at: at(30))
        #expect(queue.count == 2)
        #expect(queue.deadline(of: a) == at(30))
        #expect((queue.popDue(now: at(100)) as? Owner)?.name == "b")
        queue.schedule(a, at: at(5))
        #expect(queue.count == 1)
        #expect(queue.earliest == at(5))
    }

    @Test func cancelRemovesOnlyThatOwner() {
        var queue = TimerQueue()
        let owners = (0..<8).map { Owner("\($0)") }
        for (i, owner) in owners.enumerated() { queue.schedule(owner, at: at(Int64(100 - i * 10))) }
        queue.cancel(owners[3])
        queue.cancel(owners[7])
        queue.cancel(owners[7])  // twice: nothing more happens
        #expect(queue.count == 6)
        #expect(queue.deadline(of: owners[3]) == nil)
        var order: [String] = []
        while let owner = queue.popDue(now: at(1000)) { order.append((owner as! Owner).name) }
        #expect(order == ["6", "5", "4", "2", "1", "0"])
    }

    @Test func keepsHeapOrderThroughManyRandomOperations() {
        var queue = TimerQueue()
        var generator = SystemRandomNumberGenerator()
        let owners = (0..<200).map { Owner("\($0)") }
        var expected: [ObjectIdentifier: NIODeadline] = [:]
        for _ in 0..<5000 {
            let owner = owners.randomElement(using: &generator)!
            if Bool.random(using: &generator) {
                let deadline = at(Int64.random(in: 0..<10_000, using: &generator))
                queue.schedule(owner, at: deadline)
                expected[ObjectIdentifier(owner)] = deadline
            } else {
                queue.cancel(owner)
                expected[ObjectIdentifier(owner)] = nil
            }
        }
        #expect(queue.count == expected.count)
        for owner in owners { #expect(queue.deadline(of: owner) == expected[ObjectIdentifier(owner)]) }
        var last = at(0)
        while let owner = queue.popDue(now: at(10_000)) {
            let deadline = expected.removeValue(forKey: ObjectIdentifier(owner))!
            #expect(deadline >= last)
            last = deadline
        }
        #expect(expected.isEmpty)
    }

    @Test func anOwnerOfAnotherQueueIsNotTouched() {
        var first = TimerQueue()
        var second = TimerQueue()
        let a = Owner("a")
        let b = Owner("b")
        first.schedule(a, at: at(10))
        second.schedule(b, at: at(10))
        // b's index (0) is valid in `first` too, but that entry is a's.
        first.cancel(b)
        #expect(first.count == 1)
        #expect(first.deadline(of: b) == nil)
    }
}

@Suite struct LoopTimersTests {
    @Test func oneLoopCallbackFiresEveryDueOwnerInOrder() {
        let loop = EmbeddedEventLoop()
        let timers = LoopTimers(eventLoop: loop)
        var log: [String] = []
        let owners = (0..<3).map { Owner("\($0)") }
        for owner in owners { owner.onFire = { log.append(owner.name) } }
        timers.schedule(owners[2], at: loop.now + .milliseconds(30))
        timers.schedule(owners[0], at: loop.now + .milliseconds(10))
        timers.schedule(owners[1], at: loop.now + .milliseconds(10))
        loop.advanceTime(by: .milliseconds(9))
        #expect(log.isEmpty)
        loop.advanceTime(by: .milliseconds(1))
        #expect(Set(log) == ["0", "1"])
        loop.advanceTime(by: .milliseconds(20))
        #expect(log.count == 3 && log.last == "2")
        #expect(timers.count == 0)
    }

    @Test func aCancelledOwnerIsNotCalled() {
        let loop = EmbeddedEventLoop()
        let timers = LoopTimers(eventLoop: loop)
        let a = Owner("a")
        let b = Owner("b")
        timers.schedule(a, at: loop.now + .milliseconds(10))
        timers.schedule(b, at: loop.now + .milliseconds(20))
        timers.cancel(a)
        loop.advanceTime(by: .milliseconds(15))
        #expect(a.fired.isEmpty && b.fired.isEmpty)
        loop.advanceTime(by: .milliseconds(5))
        #expect(a.fired.isEmpty && b.fired.count == 1)
    }

    @Test func anEarlierDeadlineRearmsAndALaterOneFiresOnTime() {
        let loop = EmbeddedEventLoop()
        let timers = LoopTimers(eventLoop: loop)
        let a = Owner("a")
        a.clock = { loop.now }
        let start = loop.now
        timers.schedule(a, at: start + .milliseconds(50))
        timers.schedule(a, at: start + .milliseconds(20))
        loop.advanceTime(by: .milliseconds(20))
        #expect(a.fired == [start + .milliseconds(20)])
        // Moved later while armed for earlier: the early wake-up finds nothing due and re-arms.
        timers.schedule(a, at: start + .milliseconds(30))
        timers.schedule(a, at: start + .milliseconds(60))
        loop.advanceTime(by: .milliseconds(20))
        #expect(a.fired.count == 1)
        loop.advanceTime(by: .milliseconds(20))
        #expect(a.fired == [start + .milliseconds(20), start + .milliseconds(60)])
    }

    @Test func anOwnerMayScheduleAgainWhenCalled() {
        let loop = EmbeddedEventLoop()
        let timers = LoopTimers(eventLoop: loop)
        let a = Owner("a")
        a.onFire = { [unowned a] in if a.fired.count < 3 { timers.schedule(a, at: loop.now + .milliseconds(10)) } }
        timers.schedule(a, at: loop.now + .milliseconds(10))
        loop.advanceTime(by: .milliseconds(100))
        #expect(a.fired.count == 3)
        #expect(timers.count == 0)
    }
}
