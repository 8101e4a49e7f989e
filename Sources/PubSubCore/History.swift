import NIOCore

/// The bounded history of published events, shared by every subscriber: each event is stored once, as the
/// same encoded bytes its live recipients got. Bounded by count, by bytes and, optionally, by age; whatever
/// bound is hit, the oldest entries go first, so what is held is always a contiguous run of sequences.
package struct History: Sendable {
    package struct Entry: Sendable {
        package var sequence: UInt64
        package var channel: String
        package var event: WireEvent
        package var publishedAt: NIODeadline
        /// The memory engine's place of the event in its fan-out order (`MemoryEngine.Shard`): a resuming
        /// subscribe replays only what its shard has already queued; the rest reaches it live.
        package var ticket: UInt64

        package init(
            sequence: UInt64, channel: String, event: WireEvent, publishedAt: NIODeadline, ticket: UInt64 = 0
        ) {
            self.sequence = sequence
            self.channel = channel
            self.event = event
            self.publishedAt = publishedAt
            self.ticket = ticket
        }

        /// What the entry counts against the byte bound: its event's bytes and its channel name, as every engine
        /// counts them. The compressed frame an event's buffer may carry (WebSocket compression) is not counted:
        /// it is smaller than the event, so the memory held stays under twice the bound.
        package var cost: Int { event.json.readableBytes + channel.utf8.count }
    }

    package let capacity: Int
    /// The most bytes (summed `Entry.cost`) held; 0: no byte bound.
    package let maxBytes: Int
    /// Entries older than this are dropped; nil keeps them until the capacity pushes them out.
    package let maxAge: TimeAmount?
    package private(set) var entries = CircularBuffer<Entry>()
    /// The summed `cost` of `entries`.
    package private(set) var bytes = 0
    /// The sequence of the newest event ever appended (0 before the first).
    package private(set) var lastSequence: UInt64 = 0
    /// The last sequence handed out (`nextSequence`): ahead of `lastSequence` while events are being encoded.
    private var issued: UInt64 = 0

    package init(capacity: Int, maxBytes: Int = 0, maxAge: TimeAmount?) {
        self.capacity = capacity
        self.maxBytes = maxBytes
        self.maxAge = maxAge
        entries.reserveCapacity(min(capacity, 4096))
    }

    package var isEnabled: Bool { capacity > 0 }

    /// Takes the next sequence number. Entries are appended in sequence order (`append`).
    package mutating func nextSequence() -> UInt64 {
        issued += 1
        return issued
    }

    /// Appends an entry, dropping the oldest while over a bound. An entry over the byte bound on its own is not
    /// kept, and nothing older is either (a resume from before it can then only be `recovered: false`).
    package mutating func append(_ entry: Entry) {
        lastSequence = entry.sequence
        guard capacity > 0 else { return }
        if entries.count >= capacity { dropFirst() }
        let cost = entry.cost
        if maxBytes > 0 {
            guard cost <= maxBytes else {
                entries.removeAll(keepingCapacity: true)
                bytes = 0
                return
            }
            while bytes + cost > maxBytes { dropFirst() }
        }
        entries.append(entry)
        bytes += cost
    }

    private mutating func dropFirst() {
        bytes -= entries.removeFirst().cost
    }

    package mutating func prune(now: NIODeadline) {
        guard let maxAge else { return }
        while let first = entries.first, first.publishedAt + maxAge <= now { dropFirst() }
    }

    /// The entries after `sequence`, if none of them has been dropped.
    package func entries(after sequence: UInt64) -> ArraySlice<Entry>? {
        guard sequence <= lastSequence else { return nil }
        if sequence == lastSequence { return [] }
        guard let first = entries.first, first.sequence <= sequence + 1 else { return nil }
        // Sequences are contiguous in the buffer: index arithmetic instead of a search.
        let start = entries.index(entries.startIndex, offsetBy: Int(sequence + 1 - first.sequence))
        return ArraySlice(entries[start...])
    }

    /// How many entries after `sequence` are still held (a lower bound of what was missed).
    package func countHeld(after sequence: UInt64, matching: (String) -> Bool) -> Int {
        entries.reduce(0) { $0 + ($1.sequence > sequence && matching($1.channel) ? 1 : 0) }
    }
}
