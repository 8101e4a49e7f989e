import NIOCore
import Testing

@testable import PubSubRedis

/// Which connects skip the `touch` script, and the batches (expiry refreshes, then a barrier) that replace it.
@Suite struct ResidencyLedgerTests {
    let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    func ledger() -> ResidencyLedger<Int> { ResidencyLedger(lifetime: .seconds(90)) }

    @Test func anUnconfirmedSessionAsksRedis() {
        var l = ledger()
        guard case .touch = l.connect("a", now: t0, expiry: 1, waiter: 1) else {
            Issue.record("expected touch")
            return
        }
        #expect(l.waiting == 0)
    }

    @Test func aConfirmedSessionWaitsForOneBatchThatRefreshesItsExpiry() {
        var l = ledger()
        l.confirmed("a", now: t0, generation: l.generation)
        guard case .wait(let batch?) = l.connect("a", now: t0 + .seconds(2), expiry: 92_000, waiter: 1) else {
            Issue.record("expected a batch to send")
            return
        }
        #expect(batch.refreshes.map(\.id) == ["a"] && batch.refreshes.map(\.expiry) == [92_000])
        let (waiters, next) = l.settled(batch.barrier)
        #expect(waiters == [1])
        #expect(next == nil)
        #expect(l.waiting == 0)
    }

    @Test func connectsDuringABatchShareTheNextOne() {
        var l = ledger()
        for id in ["a", "b", "c"] { l.confirmed(id, now: t0, generation: l.generation) }
        guard case .wait(let first?) = l.connect("a", now: t0, expiry: 10, waiter: 1) else {
            Issue.record("expected a batch to send")
            return
        }
        // In flight: the next connects wait, nothing is sent.
        guard case .wait(nil) = l.connect("b", now: t0, expiry: 20, waiter: 2),
            case .wait(nil) = l.connect("c", now: t0, expiry: 30, waiter: 3),
            case .wait(nil) = l.connect("b", now: t0, expiry: 25, waiter: 4)
        else {
            Issue.record("expected to wait")
            return
        }
        // A barrier of another batch settles nothing.
        let unrelated = l.settled(first.barrier + 7)
        #expect(unrelated.waiters.isEmpty)
        let (waiters, next) = l.settled(first.barrier)
        #expect(waiters == [1])
        guard let next else {
            Issue.record("expected the next batch")
            return
        }
        #expect(next.barrier != first.barrier)
        // One refresh per session, the latest expiry.
        let refreshes = Dictionary(uniqueKeysWithValues: next.refreshes.map { ($0.id, $0.expiry) })
        #expect(refreshes == ["b": 25, "c": 30])
        let last = l.settled(next.barrier)
        #expect(last.waiters == [2, 3, 4])
    }

    @Test func aResetForgetsConfirmationsAndHandsEveryWaiterBack() {
        var l = ledger()
        l.confirmed("a", now: t0, generation: l.generation)
        l.confirmed("b", now: t0, generation: l.generation)
        let before = l.generation
        guard case .wait(let first?) = l.connect("a", now: t0, expiry: 1, waiter: 1),
            case .wait(nil) = l.connect("b", now: t0, expiry: 1, waiter: 2)
        else {
            Issue.record("expected to wait")
            return
        }
        let handedBack = l.reset()
        #expect(handedBack.sorted() == [1, 2])
        #expect(l.confirmedCount == 0)
        // The old batch's barrier, should it still come, settles nothing.
        let stale = l.settled(first.barrier)
        #expect(stale.waiters.isEmpty)
        // A confirmation asked before the cut and answered after it is not trusted.
        l.confirmed("a", now: t0, generation: before)
        guard case .touch = l.connect("a", now: t0, expiry: 1, waiter: 3) else {
            Issue.record("expected touch")
            return
        }
        // One asked after it is.
        l.confirmed("a", now: t0, generation: l.generation)
        guard case .wait(_?) = l.connect("a", now: t0, expiry: 1, waiter: 4) else {
            Issue.record("expected a batch")
            return
        }
    }

    @Test func aSessionThatLeftAsksRedisAgainAndLeavesTheBatch() {
        var l = ledger()
        l.confirmed("a", now: t0, generation: l.generation)
        l.confirmed("b", now: t0, generation: l.generation)
        guard case .wait(let first?) = l.connect("b", now: t0, expiry: 1, waiter: 1),
            case .wait(nil) = l.connect("a", now: t0, expiry: 5, waiter: 2)
        else {
            Issue.record("expected to wait")
            return
        }
        // `a` moved to another node (its `M` arrived): no refresh for it; its waiter still gets the barrier
        // (the engine then finds it gone and claims it back).
        l.forget("a")
        let (_, next) = l.settled(first.barrier)
        #expect(next?.refreshes.isEmpty == true)
        let after = l.settled(next!.barrier)
        #expect(after.waiters == [2])
        guard case .touch = l.connect("a", now: t0, expiry: 1, waiter: 3) else {
            Issue.record("expected touch")
            return
        }
    }

    @Test func entriesWithoutAConnectForALifetimeArePruned() {
        var l = ledger()
        l.confirmed("old", now: t0, generation: l.generation)
        l.confirmed("older", now: t0 + .seconds(5), generation: l.generation)
        l.confirmed("new", now: t0 + .seconds(60), generation: l.generation)
        l.prune(now: t0 + .seconds(60))
        #expect(l.confirmedCount == 3)
        l.prune(now: t0 + .seconds(91))
        #expect(l.confirmedCount == 2)
        // At most once per quarter lifetime: `older` (95 s) waits for the next prune.
        l.prune(now: t0 + .seconds(100))
        #expect(l.confirmedCount == 2)
        l.prune(now: t0 + .seconds(114))
        #expect(l.confirmedCount == 1)
        guard case .touch = l.connect("old", now: t0 + .seconds(114), expiry: 1, waiter: 1) else {
            Issue.record("expected touch")
            return
        }
    }

    @Test func confirmationsBeyondCapacityAreNotKept() {
        var l = ResidencyLedger<Int>(lifetime: .seconds(90), capacity: 2)
        for id in ["a", "b", "c"] { l.confirmed(id, now: t0, generation: l.generation) }
        #expect(l.confirmedCount == 2)
        guard case .touch = l.connect("c", now: t0, expiry: 1, waiter: 1) else {
            Issue.record("expected touch")
            return
        }
    }
}
