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
    /// The events handed out in one batch, as the engine handed them (one buffer per take, shared, not copied).
    private struct Span: Sendable {
        var batch: UInt32
        var events: CircularBuffer<WireEvent>
    }

    private var spans = Self.noSpans
    /// One shared empty storage: every session has a ledger, most of the time empty.
    private static let noSpans = CircularBuffer<Span>(initialCapacity: 1)
    /// Events in `spans`.
    private(set) var count: Int32 = 0
    /// The batch that events handed out now belong to; the first is 1 (an acknowledgement of 0 confirms nothing).
    private var current: UInt32 = 1
    /// The newest batch that lost events to the bound; 0: none.
    private var lostBatch: UInt32 = 0
    /// A hash of the `id` of the connect whose reply closed the last batch (0: none, or the connect had no id).
    private var closingConnect: Int = 0
    /// The reply that closed the last batch went out on a WebSocket.
    private var closedOnSocket = false

    package init() {}

    /// Whether events were dropped that the client has not confirmed: it may have missed them.
    package var hasGap: Bool { lostBatch != 0 }
    package var isEmpty: Bool { count == 0 }

    /// Events handed to the session's connection now.
    package mutating func handedOut(_ events: CircularBuffer<WireEvent>, capacity: Int) {
        guard !events.isEmpty else { return }
        // A span per take: the buffer the connection got is kept as it is, never appended to (a copy).
        spans.append(Span(batch: current, events: events))
        count += Int32(events.count)
        while Int(count) > capacity, let first = spans.first {
            lostBatch = max(lostBatch, first.batch)
            count -= Int32(first.events.count)
            spans.removeFirst()
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
        while let first = spans.first, first.batch <= upTo {
            count -= Int32(first.events.count)
            spans.removeFirst()
        }
        if lostBatch <= upTo { lostBatch = 0 }
    }

    /// Takes every unconfirmed event, oldest first, to be sent again; a gap stays known until confirmed past.
    package mutating func takeUnconfirmed() -> CircularBuffer<WireEvent> {
        guard let first = spans.first else { return .noEvents }
        var events = first.events
        for span in spans.dropFirst() { events.append(contentsOf: span.events) }
        spans = Self.noSpans
        count = 0
        return events
    }

    /// Takes what was handed out after the last connect reply, to go with a session that moves to another node:
    /// the connect that moves it is taken to confirm every batch closed here (the other node cannot tell a
    /// repeated connect from a new one), so what follows the last reply, what a dead WebSocket lost, goes along.
    package mutating func takeOpenBatch() -> CircularBuffer<WireEvent> {
        var events = CircularBuffer<WireEvent>.noEvents
        for span in spans where span.batch == current { events.append(contentsOf: span.events) }
        spans = Self.noSpans
        count = 0
        lostBatch = 0
        return events
    }

    /// Removes the events a resume supersedes: its range, which goes out again as a whole, and what the client
    /// already had of the channels it resumed (`MemoryEngine.placeRange`).
    package mutating func remove(where superseded: (WireEvent) -> Bool) {
        guard count > 0 else { return }
        for i in spans.indices {
            let before = spans[i].events.count
            spans[i].events.removeAll(where: superseded)
            count -= Int32(before - spans[i].events.count)
        }
    }

    /// The session moves to another node or ends: nothing is kept.
    package mutating func reset() {
        spans = Self.noSpans
        count = 0
        lostBatch = 0
    }

    private static func hash(_ id: JSONValue?) -> Int {
        guard let id else { return 0 }
        let value = id.hashValue
        return value == 0 ? 1 : value
    }
}
