import NIOCore
import Testing

@testable import PubSubCore

@Suite struct HistoryTests {
    static let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)

    /// Appends an event of `size` bytes on channel `/c` (cost `size + 2`).
    static func append(_ history: inout History, size: Int) -> UInt64 {
        let sequence = history.nextSequence()
        history.append(
            History.Entry(
                sequence: sequence, channel: "/c", event: WireEvent(json: ByteBuffer(repeating: 0x61, count: size)),
                publishedAt: t0))
        return sequence
    }

    @Test func theOldestGoWhileOverTheByteBound() {
        var history = History(capacity: 1000, maxBytes: 300, maxAge: nil)
        for _ in 1...10 { _ = Self.append(&history, size: 98) }
        #expect(history.entries.map(\.sequence) == [8, 9, 10])
        #expect(history.bytes == 300)
        #expect(history.entries(after: 7)?.map(\.sequence) == [8, 9, 10])
        #expect(history.entries(after: 6) == nil)
    }

    @Test func theCountBoundStillHolds() {
        var history = History(capacity: 2, maxBytes: 1 << 20, maxAge: nil)
        for _ in 1...5 { _ = Self.append(&history, size: 10) }
        #expect(history.entries.map(\.sequence) == [4, 5])
        #expect(history.bytes == 24)
    }

    @Test func anEntryOverTheBoundAloneIsNotKeptNorIsAnythingBeforeIt() {
        var history = History(capacity: 1000, maxBytes: 300, maxAge: nil)
        _ = Self.append(&history, size: 50)
        let big = Self.append(&history, size: 500)
        #expect(history.entries.isEmpty)
        #expect(history.bytes == 0)
        #expect(history.entries(after: big - 1) == nil)
        #expect(history.entries(after: big)?.isEmpty == true)
        _ = Self.append(&history, size: 50)
        #expect(history.entries(after: big)?.map(\.sequence) == [big + 1])
    }

    @Test func zeroMeansNoByteBound() {
        var history = History(capacity: 1000, maxBytes: 0, maxAge: nil)
        for _ in 1...10 { _ = Self.append(&history, size: 1 << 16) }
        #expect(history.entries.count == 10)
        #expect(history.bytes == 10 * ((1 << 16) + 2))
    }

    @Test func pruningByAgeKeepsTheByteTotal() {
        var history = History(capacity: 1000, maxBytes: 1000, maxAge: .seconds(1))
        for _ in 1...3 { _ = Self.append(&history, size: 8) }
        history.prune(now: Self.t0 + .seconds(2))
        #expect(history.entries.isEmpty)
        #expect(history.bytes == 0)
    }
}
