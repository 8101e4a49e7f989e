import Testing

@testable import PubSubClient

@Suite struct RecentPositionsTests {
    @Test func aPositionIsTakenOnce() {
        var recent = RecentPositions(capacity: 3)
        let taken = ["2.e.a", "2.e.b", "2.e.a"].map { recent.insert($0) }
        #expect(taken == [true, true, false])
        #expect(recent.count == 2)
    }

    @Test func theOldestIsForgottenFirstOnceFull() {
        var recent = RecentPositions(capacity: 3)
        let first = ["a", "b", "c", "d"].map { recent.insert($0) }
        #expect(first == [true, true, true, true])
        #expect(recent.count == 3)
        #expect(!recent.contains("a"))
        #expect(["b", "c", "d"].allSatisfy(recent.contains))
        // Wraps around: e pushes b out, a (new again) pushes c out, and d is still held.
        let then = ["e", "a", "d"].map { recent.insert($0) }
        #expect(then == [true, true, false])
        #expect(!recent.contains("b") && !recent.contains("c"))
        #expect(recent.count == 3)
    }

    @Test func holdsTheDefaultThousand() {
        var recent = RecentPositions()
        let fresh = (0..<1500).map { recent.insert("2.e.\($0)") }
        #expect(fresh.allSatisfy { $0 })
        #expect(recent.count == 1000)
        let again = ["2.e.1499", "2.e.500", "2.e.499"].map { recent.insert($0) }
        #expect(again == [false, false, true])
    }
}
