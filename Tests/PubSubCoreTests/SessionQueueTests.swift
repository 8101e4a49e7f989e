import NIOCore
import Testing

@testable import PubSubCore

/// A session's queue: its storage goes to the connection at each take and is taken back, emptied, at the next
/// event; a connection that still holds it keeps what it was handed.
@Suite struct SessionQueueTests {
    static func event(_ n: Int) -> WireEvent { WireEvent(json: ByteBuffer(string: "[{\"data\":\(n)}]")) }

    @Test func whatWasTakenStaysWholeWhileTheQueueGoesOn() {
        var queue = SessionQueue()
        #expect(queue.isEmpty && queue.take().isEmpty)
        queue.append(Self.event(1))
        queue.append(Self.event(2))
        let taken = queue.take()
        #expect(queue.isEmpty && queue.events.isEmpty)
        queue.append(Self.event(3))
        #expect(DeliveryLedgerTests.numbers(taken) == [1, 2])
        #expect(DeliveryLedgerTests.numbers(queue.events) == [3])
        let again = queue.take()
        queue.release()
        #expect(DeliveryLedgerTests.numbers(again) == [3] && queue.isEmpty)
    }

    @Test func replacingAndClearing() {
        var queue = SessionQueue()
        queue.append(Self.event(2))
        var merged = CircularBuffer([Self.event(1)])
        merged.append(contentsOf: queue.events)
        queue.replace(with: merged)
        queue.append(Self.event(3))
        #expect(DeliveryLedgerTests.numbers(queue.events) == [1, 2, 3] && queue.count == 3)
        queue.clear()
        #expect(queue.isEmpty)
        queue.append(Self.event(4))
        #expect(DeliveryLedgerTests.numbers(queue.take()) == [4])
    }

    /// Past `keptCapacity` the storage is let go when emptied (a burst does not keep its size for good).
    @Test func aLargeStorageIsLetGoAndTheQueueGoesOn() {
        var queue = SessionQueue()
        for n in 1...(SessionQueue.keptCapacity * 2) { queue.append(Self.event(n)) }
        #expect(queue.take().count == SessionQueue.keptCapacity * 2)
        queue.append(Self.event(0))
        #expect(DeliveryLedgerTests.numbers(queue.events) == [0])
    }
}
