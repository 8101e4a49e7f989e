import NIOConcurrencyHelpers
import PubSubTesting
import Testing

@testable import PubSubRelay

/// The waiting shared by the push feed (`settled()`) and the change stream's demand: no wake-up missed, every
/// parked task let go by a change or by its cancellation.
@Suite(.timeLimit(.minutes(1))) struct ParkedTasksTests {
    @Test func aConditionThatHoldsAlreadyDoesNotPark() async {
        let parked = ParkedTasks()
        await parked.wait(while: { false })
        #expect(parked.count == 0)
    }

    @Test func aParkedTaskAsksAgainAtEachWakeAndGoesOnOnceItsConditionHolds() async throws {
        let parked = ParkedTasks()
        let value = NIOLockedValueBox(0)
        let waiter = Task { await parked.wait(while: { value.withLockedValue { $0 } < 2 }) }
        #expect(try await waitUntil { parked.count == 1 })
        value.withLockedValue { $0 = 1 }
        parked.wakeAll()
        // Still short of 2: it parks again.
        #expect(try await waitUntil { parked.count == 1 })
        value.withLockedValue { $0 = 2 }
        parked.wakeAll()
        await waiter.value
        #expect(parked.count == 0)
    }

    @Test func aCancelledTaskGoesOnAtOnce() async throws {
        let parked = ParkedTasks()
        let waiter = Task { await parked.wait(while: { true }) }
        #expect(try await waitUntil { parked.count == 1 })
        waiter.cancel()
        await waiter.value
        #expect(parked.count == 0)
    }

    @Test func manyChangesRacingManyWaitersMissNoWake() async {
        let parked = ParkedTasks()
        let value = NIOLockedValueBox(0)
        await withTaskGroup(of: Void.self) { group in
            for target in 1...200 {
                group.addTask { await parked.wait(while: { value.withLockedValue { $0 } < target }) }
            }
            group.addTask {
                for _ in 1...200 {
                    value.withLockedValue { $0 += 1 }
                    parked.wakeAll()
                    await Task.yield()
                }
            }
        }
        #expect(parked.count == 0)
    }
}
