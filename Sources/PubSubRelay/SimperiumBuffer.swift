import NIOConcurrencyHelpers
import NIOCore

/// One item read from a Simperium stream for the relay: a change (or none, when only the position moves, as at the
/// end of an empty index) and the position to checkpoint once it and everything before it is relayed.
struct SimperiumEntry: Sendable {
    var change: Change?
    var position: String
    /// Set on the first entry of a full resync.
    var resync: Resync?
}

/// The bounded queue between the connection (producer) and the relay (consumer): `put` suspends while it is full,
/// `take` waits at most a short while for the first entry. Reading the feed thus overlaps publishing, and a slow
/// broker slows the reading down instead of growing memory.
final class SimperiumBuffer: Sendable {
    private struct State {
        var entries: [SimperiumEntry] = []
        var head = 0
        var producer: CheckedContinuation<Void, Never>?
        var consumer: CheckedContinuation<Void, Never>?
        var count: Int { entries.count - head }
    }

    let capacity: Int
    private let state = NIOLockedValueBox(State())

    init(capacity: Int) { self.capacity = max(1, capacity) }

    var count: Int { state.withLockedValue { $0.count } }

    /// Appends an entry, waiting while the buffer is full; throws `CancellationError` when the producer is
    /// cancelled meanwhile (the connection was dropped).
    func put(_ entry: SimperiumEntry) async throws {
        while true {
            try Task.checkCancellation()
            let consumer: CheckedContinuation<Void, Never>?? = state.withLockedValue { state in
                guard state.count < capacity else { return .none }
                state.entries.append(entry)
                defer { state.consumer = nil }
                return .some(state.consumer)
            }
            if let consumer {
                consumer?.resume()
                return
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let resumeNow = state.withLockedValue { state -> Bool in
                        if state.count < capacity || Task.isCancelled { return true }
                        state.producer = continuation
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            } onCancel: {
                state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
                    defer { state.producer = nil }
                    return state.producer
                }?.resume()
            }
        }
    }

    /// Up to `max` entries; waits up to `wait` for the first one and returns an empty array if none came.
    func take(max: Int, wait: TimeAmount) async -> [SimperiumEntry] {
        if let taken = takeNow(max: max) { return taken }
        let deadline = NIODeadline.now() + wait
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let resumeNow = self.state.withLockedValue { state -> Bool in
                        if state.count > 0 || Task.isCancelled { return true }
                        state.consumer = continuation
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            }
            group.addTask {
                let remaining = deadline - NIODeadline.now()
                try? await Task.sleep(nanoseconds: UInt64(Swift.max(0, remaining.nanoseconds)))
                self.wakeConsumer()
            }
            _ = await group.next()
            group.cancelAll()
            // Both tasks must end: the waiting one is woken in case the timer was not the one that fired.
            self.wakeConsumer()
        }
        return takeNow(max: max) ?? []
    }

    private func takeNow(max: Int) -> [SimperiumEntry]? {
        let (taken, producer) = state.withLockedValue { state -> ([SimperiumEntry]?, CheckedContinuation<Void, Never>?) in
            guard state.count > 0 else { return (nil, nil) }
            let end = Swift.min(state.entries.count, state.head + Swift.max(1, max))
            var taken = Array(state.entries[state.head..<end])
            // The first entry of a resync starts a batch of its own, so that the batch carries the resync.
            if let index = taken.indices.dropFirst().first(where: { taken[$0].resync != nil }) {
                taken.removeSubrange(index...)
            }
            state.head += taken.count
            if state.head > 1024 && state.head * 2 > state.entries.count {
                state.entries.removeFirst(state.head)
                state.head = 0
            }
            defer { state.producer = nil }
            return (taken, state.producer)
        }
        producer?.resume()
        return taken
    }

    private func wakeConsumer() {
        state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
            defer { state.consumer = nil }
            return state.consumer
        }?.resume()
    }

    /// Drops everything queued (entries of a connection that was lost; they are read again after the reconnect).
    func removeAll() {
        let producer = state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
            state.entries.removeAll()
            state.head = 0
            defer { state.producer = nil }
            return state.producer
        }
        producer?.resume()
    }
}
