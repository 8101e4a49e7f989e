import Bayeux
import NIOCore

/// What one session's connections were handed and the client has not yet confirmed, so that events written into
/// a connection that died are sent again on the next one instead of being lost with the socket's buffers.
///
/// An event handed to a connection is not delivered: the kernels on both sides may hold hundreds of KB of a
/// reader that stalled, and a reset throws them away. What proves the client read something is its next
/// `/meta/connect`, since a client sends one only after it has processed the reply to the previous one, and a
/// connection writes in order. So everything handed out before a connect reply went out forms a **batch**
/// (closed by `closeBatch` as that reply is written), and a connect confirms batches:
/// - with CometD's acknowledgement extension, the batch number it names (`ext.ack`: the reply's own number);
/// - otherwise every batch closed so far, unless the connect repeats the `id` of the connect whose reply closed
///   the last batch: a client re-sends a connect whose reply it never got (Faye's retry, a browser re-sending
///   a POST on a new connection), so that batch is not confirmed. Nor is it when the connect opens a new
///   WebSocket and that batch's reply went out on a WebSocket: a client whose socket died may send a new connect
///   in place of the one whose reply it lost. (A reply that went out on a long-poll came whole or not at all:
///   Faye's client that falls back to long-polling and comes back on a new WebSocket gets nothing twice.)
/// When a connect arrives on another connection than the one that carried the session (a WebSocket that died, a
/// long-polling request), what is still unconfirmed is handed back (`takeUnconfirmed`) to go out again, before
/// anything newer. On one live connection nothing is taken back: what follows the last reply is on its way.
///
/// Bounded: at most `capacity` events; past it the oldest go and the ledger remembers a gap (`hasGap`) until the
/// client confirms past it, so that a session that comes back after such a loss is told, never left silent.
/// EventSource streams are not kept here: their connects travel apart from the stream and prove nothing of it.
package struct DeliveryLedger: Sendable {
    /// How many of `events`, from the oldest on, one batch holds.
    private struct Span: Sendable {
        var batch: UInt32
        var count: Int32
    }

    /// Every event handed out and not confirmed, oldest first: a copy of the references (the connection got the
    /// queue's own storage), in storage kept from one batch to the next, so that handing out allocates nothing
    /// once the session has had events (up to `SessionQueue.keptCapacity` is kept when it empties).
    private var events = CircularBuffer<WireEvent>.noEvents
    /// `events` is this ledger's own storage, not the shared empty one.
    private var owned = false
    /// The batches of `events` but the newest, oldest first (a span may have no events left after `remove`).
    private var spans = Self.noSpans
    /// The newest batch's span (none when its count is 0), kept apart: handing out more of the current batch
    /// touches no buffer but `events`.
    private var tail = Span(batch: 0, count: 0)
    /// One shared empty storage: every session has a ledger, most of the time empty.
    private static let noSpans = CircularBuffer<Span>(initialCapacity: 1)
    /// The batch that events handed out now belong to; the first is 1 (an acknowledgement of 0 confirms nothing).
    private var current: UInt32 = 1
    /// The newest batch that lost events to the bound; 0: none.
    private var lostBatch: UInt32 = 0
    /// A hash of the `id` of the connect whose reply closed the last batch (0: none, or the connect had no id).
    private var closingConnect: Int = 0
    /// The reply that closed the last batch went out on a WebSocket.
    private var closedOnSocket = false

    package init() {}

    /// Events handed out and not confirmed.
    package var count: Int { events.count }
    /// Whether events were dropped that the client has not confirmed: it may have missed them.
    package var hasGap: Bool { lostBatch != 0 }
    package var isEmpty: Bool { events.isEmpty }

    /// Events handed to the session's connection now.
    package mutating func handedOut(_ handed: CircularBuffer<WireEvent>, capacity: Int) {
        guard !handed.isEmpty else { return }
        if !owned {
            events = CircularBuffer(initialCapacity: max(SessionQueue.keptCapacity, handed.count))
            owned = true
        }
        // One by one: `append(contentsOf:)` allocates per element in an unoptimized build (CI counts those).
        var index = handed.startIndex
        while index != handed.endIndex {
            events.append(handed[index])
            index = handed.index(after: index)
        }
        if tail.batch == current {
            tail.count += Int32(handed.count)
        } else {
            if tail.count > 0 { spans.append(tail) }
            tail = Span(batch: current, count: Int32(handed.count))
        }
        // Past the bound the oldest go, and the ledger remembers the newest batch that lost some.
        while events.count > capacity, let first = oldest {
            if first.count > 0 { lostBatch = max(lostBatch, first.batch) }
            removeOldest(min(events.count - capacity, Int(first.count)))
        }
    }

    /// The oldest span: the first of `spans`, else the tail if it has events.
    private var oldest: Span? {
        if let first = spans.first { return first }
        return tail.count > 0 ? tail : nil
    }

    /// Removes `k` events of the oldest span, and the span itself once it has none left.
    private mutating func removeOldest(_ k: Int) {
        events.removeFirst(k)
        if var first = spans.first {
            first.count -= Int32(k)
            spans.removeFirst()
            if first.count > 0 { spans.prepend(first) }
        } else {
            tail.count -= Int32(k)
        }
        if events.isEmpty { emptied() }
    }

    /// Nothing is held: a small storage stays for the next batches, a large one goes.
    private mutating func emptied() {
        if events.capacity > SessionQueue.keptCapacity {
            events = .noEvents
            owned = false
        }
    }

    /// A connect reply is being written: what was handed out so far is one batch. Returns its number (the
    /// reply's `ext.ack` for a client of the acknowledgement extension).
    package mutating func closeBatch(connectId: JSONValue?, onSocket: Bool = false) -> UInt32 {
        closingConnect = Self.hash(connectId)
        closedOnSocket = onSocket
        let batch = current
        current &+= 1
        return batch
    }

    /// A connect arrived: drops the batches it proves were read (see the type's description). `opensSocket`: it is
    /// the first on a new WebSocket of the session.
    package mutating func confirm(connectId: JSONValue?, ack: UInt64?, opensSocket: Bool = false) {
        let closed = current &- 1
        let upTo: UInt32
        if let ack {
            upTo = UInt32(min(ack, UInt64(closed)))
        } else if (opensSocket && closedOnSocket) || (closingConnect != 0 && Self.hash(connectId) == closingConnect) {
            upTo = closed == 0 ? 0 : closed - 1
        } else {
            upTo = closed
        }
        while let first = oldest, first.batch <= upTo { removeOldest(Int(first.count)) }
        if lostBatch <= upTo { lostBatch = 0 }
    }

    /// Takes every unconfirmed event, oldest first, to be sent again; a gap stays known until confirmed past.
    package mutating func takeUnconfirmed() -> CircularBuffer<WireEvent> {
        guard !events.isEmpty else { return .noEvents }
        let taken = events
        clear()
        return taken
    }

    /// Takes what was handed out after the last connect reply, to go with a session that moves to another node:
    /// the connect that moves it is taken to confirm every batch closed here (the other node cannot tell a
    /// repeated connect from a new one), so what follows the last reply, what a dead WebSocket lost, goes along.
    package mutating func takeOpenBatch() -> CircularBuffer<WireEvent> {
        var open = CircularBuffer<WireEvent>.noEvents
        if tail.batch == current, tail.count > 0 {
            open = CircularBuffer(initialCapacity: Int(tail.count))
            open.append(contentsOf: events.suffix(Int(tail.count)))
        }
        clear()
        lostBatch = 0
        return open
    }

    /// Removes the events a resume supersedes: its range, which goes out again as a whole, and what the client
    /// already had of the channels it resumed (`MemoryEngine.placeRange`).
    package mutating func remove(where superseded: (WireEvent) -> Bool) {
        guard !events.isEmpty else { return }
        var kept = CircularBuffer<WireEvent>(initialCapacity: events.count)
        var index = events.startIndex
        func keep(_ count: Int32) -> Int32 {
            var left: Int32 = 0
            for _ in 0..<count {
                let event = events[index]
                index = events.index(after: index)
                if !superseded(event) {
                    kept.append(event)
                    left += 1
                }
            }
            return left
        }
        for i in spans.indices { spans[i].count = keep(spans[i].count) }
        tail.count = keep(tail.count)
        events = kept
        owned = true
    }

    /// The session moves to another node or ends: nothing is kept.
    package mutating func reset() {
        events = .noEvents
        owned = false
        spans = Self.noSpans
        tail = Span(batch: 0, count: 0)
        lostBatch = 0
    }

    private mutating func clear() {
        events = .noEvents
        owned = false
        spans.removeAll(keepingCapacity: true)
        tail = Span(batch: 0, count: 0)
    }

    private static func hash(_ id: JSONValue?) -> Int {
        guard let id else { return 0 }
        let value = id.hashValue
        return value == 0 ? 1 : value
    }
}
