import Bayeux
import NIOCore
import Testing

@testable import PubSubCore

/// The ledger alone: batches, what a connect confirms, what goes out again, the bound and its gap.
@Suite struct DeliveryLedgerTests {
    static func events(_ numbers: ClosedRange<Int>) -> CircularBuffer<WireEvent> {
        CircularBuffer(numbers.map { WireEvent(json: ByteBuffer(string: "[{\"data\":\($0)}]")) })
    }

    static func numbers(_ events: CircularBuffer<WireEvent>) -> [Int] {
        events.map { Int(String(buffer: $0.json).dropFirst(9).dropLast(2))! }
    }

    @Test func aNewConnectConfirmsEveryClosedBatchButNotWhatFollowsTheLastReply() {
        var ledger = DeliveryLedger()
        ledger.handedOut(Self.events(1...2), capacity: 100)
        #expect(ledger.closeBatch(connectId: "a") == 1)
        ledger.handedOut(Self.events(3...4), capacity: 100)
        ledger.confirm(connectId: "b", ack: nil)
        // 1 and 2 went before the reply to "a"; 3 and 4 after it, unproven.
        #expect(Self.numbers(ledger.takeUnconfirmed()) == [3, 4])
        #expect(ledger.isEmpty && !ledger.hasGap)
    }

    @Test func aConnectRepeatingTheIdOfTheLastRepliedOneConfirmsOnlyTheBatchesBefore() {
        var ledger = DeliveryLedger()
        ledger.handedOut(Self.events(1...1), capacity: 100)
        _ = ledger.closeBatch(connectId: "a")
        ledger.handedOut(Self.events(2...3), capacity: 100)
        _ = ledger.closeBatch(connectId: "b")
        ledger.confirm(connectId: "b", ack: nil)
        #expect(Self.numbers(ledger.takeUnconfirmed()) == [2, 3])
        // A connect without an id proves every reply it follows.
        ledger.handedOut(Self.events(4...4), capacity: 100)
        _ = ledger.closeBatch(connectId: nil)
        ledger.confirm(connectId: nil, ack: nil)
        #expect(ledger.isEmpty)
    }

    @Test func aConnectOpeningANewSocketConfirmsOnlyTheBatchesBeforeTheLastReply() {
        var ledger = DeliveryLedger()
        ledger.handedOut(Self.events(1...1), capacity: 100)
        _ = ledger.closeBatch(connectId: "a")
        ledger.handedOut(Self.events(2...2), capacity: 100)
        _ = ledger.closeBatch(connectId: "b", onSocket: true)
        ledger.handedOut(Self.events(3...3), capacity: 100)
        // A new id, but on a new socket: the reply to "b" may have died with the old one.
        ledger.confirm(connectId: "c", ack: nil, opensSocket: true)
        #expect(Self.numbers(ledger.takeUnconfirmed()) == [2, 3])
        // A reply that went out on a long-poll came whole: a new id on a new socket confirms it.
        ledger.handedOut(Self.events(4...4), capacity: 100)
        _ = ledger.closeBatch(connectId: "d", onSocket: false)
        ledger.confirm(connectId: "e", ack: nil, opensSocket: true)
        #expect(ledger.isEmpty)
    }

    @Test func anAcknowledgementConfirmsUpToItsBatchAndNeverPastTheLastClosed() {
        var ledger = DeliveryLedger()
        ledger.handedOut(Self.events(1...1), capacity: 100)
        let one = ledger.closeBatch(connectId: "a")
        ledger.handedOut(Self.events(2...2), capacity: 100)
        let two = ledger.closeBatch(connectId: "b")
        ledger.handedOut(Self.events(3...3), capacity: 100)
        ledger.confirm(connectId: "c", ack: UInt64(one))
        #expect(Self.numbers(ledger.takeUnconfirmed()) == [2, 3])
        ledger.handedOut(Self.events(4...4), capacity: 100)
        // An acknowledgement beyond any batch closed confirms what was closed, not the open batch.
        ledger.confirm(connectId: "d", ack: UInt64(two) + 100)
        #expect(Self.numbers(ledger.takeUnconfirmed()) == [4])
    }

    @Test func theBoundDropsTheOldestAndRemembersTheGapUntilConfirmedPastIt() {
        var ledger = DeliveryLedger()
        for i in 1...5 { ledger.handedOut(Self.events(i...i), capacity: 3) }
        #expect(ledger.hasGap)
        #expect(ledger.count == 3)
        _ = ledger.closeBatch(connectId: "a")
        ledger.confirm(connectId: "b", ack: nil)
        #expect(!ledger.hasGap && ledger.isEmpty)
    }

    @Test func aRangeTakesItsEventsOutOfTheLedger() {
        var ledger = DeliveryLedger()
        let all = Self.events(1...4)
        ledger.handedOut(all, capacity: 100)
        ledger.remove(
            where: Set([all[all.index(all.startIndex, offsetBy: 1)], all[all.index(all.startIndex, offsetBy: 3)]])
                .contains)
        #expect(ledger.count == 2)
        #expect(Self.numbers(ledger.takeUnconfirmed()) == [1, 3])
    }

    /// Takes of one batch share a span; past the bound the oldest events go, one by one, not the whole batch.
    @Test func theBoundDropsTheOldestEventsOfABatchAndRemembersTheGap() {
        var ledger = DeliveryLedger()
        for n in 1...5 { ledger.handedOut(Self.events(n...n), capacity: 3) }
        #expect(ledger.count == 3 && ledger.hasGap)
        #expect(Self.numbers(ledger.takeOpenBatch()) == [3, 4, 5])
        #expect(ledger.isEmpty && !ledger.hasGap)
    }

    @Test func theOpenBatchIsWhatFollowsTheLastReplyAcrossTakes() {
        var ledger = DeliveryLedger()
        ledger.handedOut(Self.events(1...2), capacity: 100)
        _ = ledger.closeBatch(connectId: "a")
        ledger.handedOut(Self.events(3...3), capacity: 100)
        ledger.handedOut(Self.events(4...5), capacity: 100)
        #expect(Self.numbers(ledger.takeOpenBatch()) == [3, 4, 5])
        // A ledger emptied keeps working: the next batches start anew.
        ledger.handedOut(Self.events(6...6), capacity: 100)
        _ = ledger.closeBatch(connectId: "b")
        ledger.handedOut(Self.events(7...7), capacity: 100)
        ledger.confirm(connectId: "c", ack: nil)
        #expect(Self.numbers(ledger.takeUnconfirmed()) == [7])
    }

    /// The ledger keeps its own copy of what it was handed: the buffer handed out may be reused by the queue.
    @Test func whatTheLedgerKeepsDoesNotChangeWithTheBufferItWasHanded() {
        var ledger = DeliveryLedger()
        var queue = SessionQueue()
        for n in 1...3 { queue.append(Self.events(n...n).first!) }
        ledger.handedOut(queue.take(), capacity: 100)
        #expect(queue.isEmpty && queue.count == 0)
        queue.append(Self.events(4...4).first!)
        #expect(Self.numbers(queue.events) == [4])
        #expect(Self.numbers(ledger.takeUnconfirmed()) == [1, 2, 3])
    }
}
