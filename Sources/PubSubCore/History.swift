import NIOCore

/// An opaque delivery position: a format version, the history epoch and a sequence number.
/// The epoch changes whenever the history may have lost messages (a restart of the memory engine),
/// so a token from before it can never be mistaken for a position in the new history.
public struct Position: Sendable, Hashable, CustomStringConvertible {
    public var epoch: UInt64
    public var sequence: UInt64

    public init(epoch: UInt64, sequence: UInt64) {
        self.epoch = epoch
        self.sequence = sequence
    }

    /// `1.<epoch base 36>.<sequence base 36>`; clients store and return it, never parse it.
    public var description: String {
        "1." + String(epoch, radix: 36) + "." + String(sequence, radix: 36)
    }

    /// Parses a token; anything malformed or of another format version is nil.
    public init?(token: String) {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "1", parts[1].count <= 13, parts[2].count <= 13,
            let epoch = UInt64(parts[1], radix: 36), let sequence = UInt64(parts[2], radix: 36)
        else { return nil }
        self.init(epoch: epoch, sequence: sequence)
    }
}

/// The bounded history of published events, shared by every subscriber: each event is stored once, as the
/// same encoded bytes its live recipients got. Bounded by count and, optionally, by age.
public struct History: Sendable {
    public struct Entry: Sendable {
        public var sequence: UInt64
        public var channel: String
        public var event: ByteBuffer
        public var publishedAt: NIODeadline
    }

    public let capacity: Int
    /// Entries older than this are dropped; nil keeps them until the capacity pushes them out.
    public let maxAge: TimeAmount?
    public private(set) var entries = CircularBuffer<Entry>()
    /// The sequence of the newest event ever appended (0 before the first).
    public private(set) var lastSequence: UInt64 = 0

    public init(capacity: Int, maxAge: TimeAmount?) {
        self.capacity = capacity
        self.maxAge = maxAge
        entries.reserveCapacity(min(capacity, 4096))
    }

    public var isEnabled: Bool { capacity > 0 }

    /// Takes the next sequence number.
    public mutating func nextSequence() -> UInt64 {
        lastSequence += 1
        return lastSequence
    }

    public mutating func append(_ entry: Entry) {
        guard capacity > 0 else { return }
        if entries.count >= capacity { entries.removeFirst() }
        entries.append(entry)
    }

    public mutating func prune(now: NIODeadline) {
        guard let maxAge else { return }
        while let first = entries.first, first.publishedAt + maxAge <= now { entries.removeFirst() }
    }

    /// The entries after `sequence`, if none of them has been dropped.
    public func entries(after sequence: UInt64) -> ArraySlice<Entry>? {
        guard sequence <= lastSequence else { return nil }
        if sequence == lastSequence { return [] }
        guard let first = entries.first, first.sequence <= sequence + 1 else { return nil }
        // Sequences are contiguous in the buffer: index arithmetic instead of a search.
        let start = entries.index(entries.startIndex, offsetBy: Int(sequence + 1 - first.sequence))
        return ArraySlice(entries[start...])
    }

    /// How many entries after `sequence` are still held (a lower bound of what was missed).
    public func countHeld(after sequence: UInt64, matching: (String) -> Bool) -> Int {
        entries.reduce(0) { $0 + ($1.sequence > sequence && matching($1.channel) ? 1 : 0) }
    }
}
