import Bayeux

/// One change read from a source's feed: a document (or row) inserted, updated or deleted, or a whole collection
/// truncated.
public struct Change: Sendable, Hashable {
    public enum Operation: String, Sendable, Hashable {
        case insert
        case update
        case delete
        /// Every row of the collection removed at once; `id` is nil.
        case truncate
    }

    /// The collection's path below the prefix, one element per channel segment (`["public", "notes"]`).
    public var collection: [String]
    /// The document's id (for PostgreSQL the primary key, as text; a composite key as a JSON array); nil for
    /// a truncate.
    public var id: String?
    public var operation: Operation
    /// The source position of this change, opaque to subscribers (for PostgreSQL `<commit end LSN>:<index>`).
    public var seq: String
    /// The row or document, when the source has it (the new row for insert/update, the old identity for delete).
    public var document: JSONObject?
    /// Extra fields the source adds to `data` (for PostgreSQL `txn` and `ts`).
    public var extra: JSONObject
    /// The values the row or document had before this change (update, delete), when the source gives them
    /// (PostgreSQL's old row with `REPLICA IDENTITY FULL`); nil when it does not. Routes read it to tell the old
    /// audience of a row that moved or went.
    public var previous: JSONObject?
    /// Values of the source that routes may name as `{name}` (Simperium: `user`, the token's user).
    public var variables: [String: String]

    public init(
        collection: [String], id: String?, operation: Operation, seq: String, document: JSONObject? = nil,
        extra: JSONObject = [:], previous: JSONObject? = nil, variables: [String: String] = [:]
    ) {
        self.collection = collection
        self.id = id
        self.operation = operation
        self.seq = seq
        self.document = document
        self.extra = extra
        self.previous = previous
        self.variables = variables
    }
}

/// What a source hands to the relay at once: changes in feed order, and the position to confirm once all of them
/// are acknowledged. A batch may hold no change at all and still move the position (a transaction that touched
/// no relayed table, DDL).
public struct ChangeBatch: Sendable, Equatable {
    public var changes: [Change]
    /// The position after the last change of the batch, as the source writes it in its checkpoint.
    public var position: String
    /// Set on the first batch after the source could not resume from its position (`cv:?`, a lost slot, an
    /// invalid `since`) and started over from a full snapshot. The relay logs it at error level and counts it in
    /// `pubsub_relay_resyncs_total`; the batch's changes are the snapshot's first documents.
    public var resync: Resync?

    public init(changes: [Change], position: String, resync: Resync? = nil) {
        self.changes = changes
        self.position = position
        self.resync = resync
    }
}

/// Why a source started over from a full snapshot instead of resuming.
public struct Resync: Sendable, Equatable, CustomStringConvertible {
    /// One line for the log: what the server said and what position it refused.
    public var reason: String

    public init(reason: String) { self.reason = reason }
    public var description: String { reason }
}

/// How far a source is behind the feed's head, for progress lines.
public struct SourceLag: Sendable, Equatable {
    /// Bytes (PostgreSQL WAL) or changes still to read, as the source counts them.
    public var amount: UInt64
    public var unit: String

    public init(amount: UInt64, unit: String) {
        self.amount = amount
        self.unit = unit
    }
}

/// A replication change feed (PostgreSQL logical decoding, CouchDB `_changes`, Sync Gateway BLIP, Simperium).
///
/// The relay calls `start(after:)` once with its own checkpoint, then `next()` repeatedly; after every change of a
/// batch was acknowledged by the broker and the checkpoint was written durably, it calls `confirm(_:)` with the
/// batch's position. A source must never hand out a change at or below the position given to `start(after:)`,
/// even when its server replays it (a PostgreSQL slot rewinds after a crash).
public protocol ChangeSource: Sendable {
    /// Names the feed in checkpoints, idempotency keys and logs (`pg:<slot>`).
    var sourceID: String { get }
    /// Connects and resumes after `position` (nil: from wherever the feed starts).
    func start(after position: String?) async throws
    /// The next batch, waiting for it (a reader hands batches over through a bounded `ChangeStream`, see
    /// `PushFeed`); nil only once the source is closed.
    func next() async throws -> ChangeBatch?
    /// Tells the server that everything up to `position` is safely relayed (PostgreSQL: advance the slot).
    func confirm(_ position: String) async throws
    /// How far behind the feed's head the last batch was, when the source can tell.
    func lag() async -> SourceLag?
    /// Whether the source is further behind its server than it allows (PostgreSQL: the slot's lag above
    /// `behindBytes`), for readiness. Default: no.
    func isBehind() async -> Bool
    func close() async
    /// `error` (from this source, the publisher or the checkpoint file) in one line, for the relay's last words.
    /// Default: its text, with what to do about a refused certificate (`FeedTLS.describe`).
    func describe(_ error: any Error) -> String
    /// Whether every update and delete carries its old values (`Change.previous`), as PostgreSQL's replica
    /// identity gives them; else routes use what the relay remembers (`AudienceMemory`). Default: no.
    var givesPreviousValues: Bool { get }
}

extension ChangeSource {
    public var givesPreviousValues: Bool { false }
    public func isBehind() async -> Bool { false }
    public func describe(_ error: any Error) -> String { FeedTLS.describe(error) }
}
