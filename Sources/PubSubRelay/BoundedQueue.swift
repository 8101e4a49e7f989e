import NIOConcurrencyHelpers

/// A bounded FIFO between one producer task (a feed reader) and one consumer (the relay's `next()`): `push` waits
/// while the queue is full, `pop(timeout:)` waits at most `timeout` for an element. Closing it wakes everybody.
final class BoundedQueue<Element: Sendable>: Sendable {
    private struct State {
        var items: [Element] = []
        var head = 0
        var producers: [CheckedContinuation<Void, Never>] = []
        var consumer: (id: UInt64, continuation: CheckedContinuation<Element?, Never>)?
        var nextConsumerID: UInt64 = 0
        var closed = false

        var count: Int { items.count - head }

        mutating func takeFirst() -> Element? {
            guard head < items.count else { return nil }
            let element = items[head]
            head += 1
            if head > 64 && head * 2 > items.count {
                items.removeFirst(head)
                head = 0
            }
            return element
        }
    }

    private enum PushOutcome { case done(CheckedContinuation<Element?, Never>?), wait, closed }
    private enum PopOutcome { case element(Element, CheckedContinuation<Void, Never>?), empty, waiting }

    let capacity: Int
    private let state = NIOLockedValueBox(State())

    init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    var count: Int { state.withLockedValue { $0.count } }

    /// Appends `element`, waiting while the queue is full; returns false (dropping it) once the queue is closed.
    @discardableResult
    func push(_ element: Element) async -> Bool {
        while true {
            let outcome = state.withLockedValue { state -> PushOutcome in
                if state.closed { return .closed }
                if let consumer = state.consumer {
                    state.consumer = nil
                    return .done(consumer.continuation)
                }
                guard state.count < capacity else { return .wait }
                state.items.append(element)
                return .done(nil)
            }
            switch outcome {
            case .closed:
                return false
            case .done(let consumer):
                consumer?.resume(returning: element)
                return true
            case .wait:
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let resumeNow = state.withLockedValue { state -> Bool in
                        if state.closed || state.count < capacity { return true }
                        state.producers.append(continuation)
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            }
        }
    }

    /// The first element if there is one, without waiting.
    func tryPop() -> Element? {
        let (element, producer) = state.withLockedValue { state in
            let element = state.takeFirst()
            return (element, element == nil || state.producers.isEmpty ? nil : state.producers.removeFirst())
        }
        producer?.resume()
        return element
    }

    /// The first element, waiting at most `timeout` for one; nil on timeout or once closed.
    func pop(timeout: Duration) async -> Element? {
        if let element = tryPop() { return element }
        let id = state.withLockedValue { state -> UInt64 in
            state.nextConsumerID += 1
            return state.nextConsumerID
        }
        let timer = Task {
            try? await Task.sleep(for: timeout)
            let consumer = state.withLockedValue { state -> CheckedContinuation<Element?, Never>? in
                guard let consumer = state.consumer, consumer.id == id else { return nil }
                state.consumer = nil
                return consumer.continuation
            }
            consumer?.resume(returning: nil)
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { (continuation: CheckedContinuation<Element?, Never>) in
            let outcome = state.withLockedValue { state -> PopOutcome in
                if let element = state.takeFirst() {
                    return .element(element, state.producers.isEmpty ? nil : state.producers.removeFirst())
                }
                if state.closed { return .empty }
                state.consumer = (id, continuation)
                return .waiting
            }
            switch outcome {
            case .element(let element, let producer):
                producer?.resume()
                continuation.resume(returning: element)
            case .empty:
                continuation.resume(returning: nil)
            case .waiting:
                break
            }
        }
    }

    /// Drops every queued element (their producer is gone) and wakes waiting producers.
    func removeAll() {
        let producers = state.withLockedValue { state in
            state.items.removeAll()
            state.head = 0
            defer { state.producers.removeAll() }
            return state.producers
        }
        for producer in producers { producer.resume() }
    }

    func close() {
        let (producers, consumer) = state.withLockedValue { state in
            state.closed = true
            defer {
                state.producers.removeAll()
                state.consumer = nil
            }
            return (state.producers, state.consumer)
        }
        for producer in producers { producer.resume() }
        consumer?.continuation.resume(returning: nil)
    }
}
