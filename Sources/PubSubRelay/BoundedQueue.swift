import Synchronization

/// The bounded hand-over between a feed reader (the producer) and the relay's `next()` (the consumer), so reading a
/// feed overlaps publishing and a slow broker slows the reading down instead of growing memory.
///
/// `push` suspends while the queue is full; the `take`/`pop` calls wait at most a short timeout for something to
/// take and return what is there. Nothing polls: waiters sleep on continuations, woken by the call that changes
/// what they wait for. `clear` drops the queued elements (a lost connection's) and wakes the producer; `close`
/// ends the queue and wakes everybody.
final class BoundedQueue<Element: Sendable>: Sendable {
    let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    var count: Int { state.withLock { $0.count } }

    // MARK: - Producer

    /// Appends `element`, waiting while the queue is full. Returns false (dropping it) once the queue is closed;
    /// throws `CancellationError` when the producing task is cancelled before there is room.
    @discardableResult
    func push(_ element: Element) async throws -> Bool {
        while true {
            let outcome = state.withLock { state -> PushOutcome in
                if state.closed { return .closed }
                if Task.isCancelled { return .cancelled }
                guard state.count < capacity else { return .full }
                state.items.append(element)
                state.version &+= 1
                return .pushed(state.takeConsumers())
            }
            switch outcome {
            case .closed:
                return false
            case .cancelled:
                throw CancellationError()
            case .pushed(let consumers):
                for consumer in consumers { consumer.resume() }
                return true
            case .full:
                await waitForRoom()
            }
        }
    }

    private func waitForRoom() async {
        let id = state.withLock { $0.newID() }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let waiting = state.withLock { state -> Bool in
                    guard !state.closed, state.count >= capacity, !Task.isCancelled else { return false }
                    state.producers[id] = continuation
                    return true
                }
                if !waiting { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.producers.removeValue(forKey: id) }?.resume()
        }
    }

    // MARK: - Consumer

    /// Waits at most `timeout` until `extract` accepts what is queued: it sees the queued elements, front first, and
    /// returns how many of them it takes (removed from the front) and its result, or nil to wait for more. Returns
    /// nil on timeout, once the queue is closed, or when the task is cancelled.
    func take<Result: Sendable>(
        timeout: Duration, _ extract: (ArraySlice<Element>) -> (count: Int, result: Result)?
    ) async -> Result? {
        let deadline = ContinuousClock.now + timeout
        while true {
            let outcome = state.withLock { state -> TakeOutcome<Result> in
                if let (count, result) = extract(state.items[state.head...]) {
                    state.removeFirst(count)
                    return .taken(result, state.takeProducers())
                }
                return state.closed ? .closed : .nothing(state.version)
            }
            switch outcome {
            case .taken(let result, let producers):
                for producer in producers { producer.resume() }
                return result
            case .closed:
                return nil
            case .nothing(let version):
                if Task.isCancelled || ContinuousClock.now >= deadline { return nil }
                await waitForChange(since: version, until: deadline)
            }
        }
    }

    /// Up to `max` elements, waiting at most `timeout` for the first; empty if none came. An element for which
    /// `startsBatch` is true is only ever taken first: it begins a batch of its own.
    func take(max: Int, timeout: Duration, startsBatch: (Element) -> Bool = { _ in false }) async -> [Element] {
        await take(timeout: timeout) { queued -> (count: Int, result: [Element])? in
            guard let first = queued.first else { return nil }
            var taken = [first]
            for element in queued.dropFirst().prefix(Swift.max(1, max) - 1) {
                if startsBatch(element) { break }
                taken.append(element)
            }
            return (taken.count, taken)
        } ?? []
    }

    /// The first element, waiting at most `timeout` for one; nil on timeout or once closed.
    func pop(timeout: Duration) async -> Element? {
        await take(timeout: timeout) { queued in queued.first.map { (1, $0) } }
    }

    /// The first element if there is one, without waiting.
    func tryPop() -> Element? {
        let (element, producers) = state.withLock { state -> (Element?, [CheckedContinuation<Void, Never>]) in
            guard let first = state.items[state.head...].first else { return (nil, []) }
            state.removeFirst(1)
            return (first, state.takeProducers())
        }
        for producer in producers { producer.resume() }
        return element
    }

    /// Sleeps until something is pushed after `version`, the queue is closed, `deadline` passes or the task is
    /// cancelled.
    private func waitForChange(since version: UInt64, until deadline: ContinuousClock.Instant) async {
        let id = state.withLock { $0.newID() }
        let timer = Task {
            try? await Task.sleep(until: deadline, clock: .continuous)
            state.withLock { $0.consumers.removeValue(forKey: id) }?.resume()
        }
        defer { timer.cancel() }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let waiting = state.withLock { state -> Bool in
                    guard !state.closed, state.version == version, !Task.isCancelled else { return false }
                    state.consumers[id] = continuation
                    return true
                }
                if !waiting { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.consumers.removeValue(forKey: id) }?.resume()
        }
    }

    // MARK: - Clearing and closing

    /// Drops every queued element (those of a connection that was lost; they are read again after the reconnect)
    /// and wakes a waiting producer.
    func clear() {
        let producers = state.withLock { state in
            state.items.removeAll()
            state.head = 0
            return state.takeProducers()
        }
        for producer in producers { producer.resume() }
    }

    /// Ends the queue: pushes are refused from now on and every waiter is woken. What is queued can still be taken.
    func close() {
        let waiters = state.withLock { state in
            state.closed = true
            return state.takeProducers() + state.takeConsumers()
        }
        for waiter in waiters { waiter.resume() }
    }
}

extension BoundedQueue {
    private struct State {
        var items: [Element] = []
        /// Taken elements before it are dropped in bulk, so taking from the front stays cheap.
        var head = 0
        /// Bumped by every push and by closing, so that a consumer does not sleep through a change it did not see.
        var version: UInt64 = 0
        var closed = false
        var producers: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var consumers: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var lastID: UInt64 = 0

        var count: Int { items.count - head }

        mutating func newID() -> UInt64 {
            lastID &+= 1
            return lastID
        }

        mutating func removeFirst(_ count: Int) {
            head += Swift.min(count, self.count)
            if head == items.count {
                items.removeAll(keepingCapacity: true)
                head = 0
            } else if head > 1024 && head * 2 > items.count {
                items.removeFirst(head)
                head = 0
            }
        }

        mutating func takeProducers() -> [CheckedContinuation<Void, Never>] {
            defer { producers.removeAll() }
            return Array(producers.values)
        }

        mutating func takeConsumers() -> [CheckedContinuation<Void, Never>] {
            defer { consumers.removeAll() }
            return Array(consumers.values)
        }
    }

    private enum PushOutcome: Sendable {
        case pushed([CheckedContinuation<Void, Never>])
        case full
        case closed
        case cancelled
    }

    private enum TakeOutcome<Result: Sendable>: Sendable {
        case taken(Result, [CheckedContinuation<Void, Never>])
        case nothing(UInt64)
        case closed
    }
}
