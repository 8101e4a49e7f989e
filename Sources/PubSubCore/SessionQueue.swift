import NIOCore

/// A session's events not yet handed to a connection, which keeps its storage from one hand-out to the next, so
/// that queueing an event allocates nothing once the session has had one.
///
/// `take()` hands the storage itself to the connection (no copy) and leaves the queue empty in name only: the
/// storage is emptied in place at the next `append`, once the connection let go of it (a WebSocket writes what it
/// is handed at once). A connection that still holds it then (a write backlog) makes that append copy, as any
/// shared value does: never wrong, one allocation. What was handed out stays referenced until then, or until
/// `release()`; the ledger keeps its own copy for a resend (`DeliveryLedger`).
package struct SessionQueue: Sendable {
    /// Kept for the next events if no larger than this (so many references); larger storage is let go when emptied.
    static let keptCapacity = 16

    private var storage = CircularBuffer<WireEvent>.noEvents
    /// `storage` was handed out: it holds nothing of this queue.
    private var handedOut = false
    /// `storage` is this queue's own, not the shared empty one (appending to that would copy, then grow).
    private var owned = false

    package init() {}

    package var isEmpty: Bool { handedOut || storage.isEmpty }
    package var count: Int { handedOut ? 0 : storage.count }
    /// The events, oldest first (the storage, shared: no copy).
    package var events: CircularBuffer<WireEvent> { handedOut ? .noEvents : storage }

    package mutating func append(_ event: WireEvent) {
        release()
        if !owned {
            storage = CircularBuffer(initialCapacity: 4)
            owned = true
        }
        storage.append(event)
    }

    /// Every event, handed out: the queue is empty.
    package mutating func take() -> CircularBuffer<WireEvent> {
        guard !isEmpty else { return .noEvents }
        handedOut = true
        return storage
    }

    /// The queue holds `events` instead.
    package mutating func replace(with events: CircularBuffer<WireEvent>) {
        storage = events
        handedOut = false
        owned = !events.isEmpty
    }

    /// Nothing is kept, storage included (the session ends).
    package mutating func clear() {
        storage = .noEvents
        handedOut = false
        owned = false
    }

    /// Drops the references to what was handed out, keeping a small storage for the next events.
    package mutating func release() {
        guard handedOut else { return }
        handedOut = false
        if storage.capacity > Self.keptCapacity {
            clear()
        } else {
            storage.removeAll(keepingCapacity: true)
        }
    }
}
