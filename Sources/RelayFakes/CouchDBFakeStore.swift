import Bayeux
import Synchronization

/// The document store behind the fake `_changes` server: documents with revisions, the by-sequence index a
/// `_changes` feed reads (only the latest change of each document is kept, as CouchDB does), and the scripted
/// faults. Written from the protocol description (../shared/RELAY.md §1), not from the relay's client.
public final class CouchDBFakeStore: Sendable {
    /// How the server writes sequences.
    public enum Flavour: String, Sendable, CaseIterable {
        /// CouchDB 1.x and PouchDB Server: JSON integers.
        case integer
        /// CouchDB 2+/Cloudant: opaque strings `"<n>-g1AAAA…"`, understood only through the server's own table.
        case opaque
        /// Sync Gateway REST: integers, and `"<low>::<seq>"` strings while a lower sequence is pending; channel
        /// filter and `removed`.
        case syncGateway = "sync-gateway"
    }

    /// One document's latest state, as the by-sequence index holds it.
    struct Entry: Sendable {
        var seq: Int
        var id: String
        var rev: String
        var deleted: Bool
        var body: JSONObject
        var channels: [String]
        /// Channels the document left with this revision (Sync Gateway).
        var removedFrom: [String]
    }

    /// Faults applied to the next feed responses.
    public struct Faults: Sendable, Equatable {
        /// Abort the next feed response after this many rows.
        public var dropAfterRows: Int?
        /// With `dropAfterRows`: write the first half of the following row before aborting.
        public var dropMidLine = false
        /// The next feed response starts this many rows before the `since` it was given (a range sent twice).
        public var replayRows = 0
        /// The next feed response writes a line that is not JSON after this many rows, then goes on as if fine.
        public var garbageAfterRows: Int?
        public init() {}
    }

    struct State: Sendable {
        var seq = 0
        var entries: [Entry] = []
        var faults = Faults()
        /// Opaque flavour: the seq strings handed out in this epoch → their number.
        var opaqueTable: [String: Int] = [:]
        var epoch = 1
        /// Integer flavours: a `since` below this (and not 0) is unknown.
        var historyFloor = 0
        /// Feeds opened so far, and the `since` each was given (raw query value).
        var feedRequests: [String] = []
        /// The query string of each of those requests.
        var feedQueries: [String] = []
        /// Feeds with an id below this write nothing more (no rows, no heartbeats) until they are dropped.
        var mutedBelow = 0
        var stopped = false
    }

    public let flavour: Flavour
    /// The database (or Sync Gateway keyspace `db.scope.collection`) the server holds.
    public let database: String
    let state = Mutex(State())

    /// `user:password` the server requires as HTTP Basic auth (nil: none).
    public let credentials: String?

    public init(flavour: Flavour, database: String = "db", credentials: String? = nil) {
        self.flavour = flavour
        self.database = database
        self.credentials = credentials
    }

    public struct Conflict: Error, Sendable, CustomStringConvertible {
        public var description: String { "Document update conflict." }
    }

    /// Writes a document as `PUT /db/<id>` does: `rev` must name the current revision of an existing document
    /// (CouchDB answers 409 otherwise). Returns the new revision. `channels` (Sync Gateway) come from the body's
    /// `channels` array, as its default sync function does.
    @discardableResult
    public func put(_ id: String, _ body: JSONObject = [:], rev: String? = nil) throws -> String {
        try write(id, body: body, rev: rev, deleted: false)
    }

    /// Deletes as `DELETE /db/<id>?rev=` does (a tombstone without fields); returns the tombstone's revision. With
    /// `body`, as `PUT /db/<id>` of `{"_deleted": true, …}` does: CouchDB keeps the tombstone's fields, and
    /// `include_docs` shows them beside `_deleted`.
    @discardableResult
    public func delete(_ id: String, rev: String? = nil, body: JSONObject = [:]) throws -> String {
        let current = state.withLock { state in state.entries.first { $0.id == id }?.rev }
        return try write(id, body: body, rev: rev ?? current, deleted: true)
    }

    /// The current revision of a document, if any.
    public func rev(of id: String) -> String? {
        state.withLock { state in state.entries.first { $0.id == id }?.rev }
    }

    private func write(_ id: String, body: JSONObject, rev: String?, deleted: Bool) throws -> String {
        try state.withLock { state in
            let index = state.entries.firstIndex { $0.id == id }
            let old = index.map { state.entries[$0] }
            if let old, !old.deleted || rev != nil {
                guard rev == old.rev else { throw Conflict() }
            } else if old == nil, rev != nil {
                throw Conflict()
            }
            let generation = (old.flatMap { Int($0.rev.prefix { $0 != "-" }) } ?? 0) + 1
            state.seq += 1
            let newRev = "\(generation)-" + Self.hash("\(id)|\(state.seq)")
            var channels: [String] = []
            if case .array(let values)? = body["channels"] { channels = values.compactMap(\.stringValue) }
            let removed = (old?.channels ?? []).filter { !channels.contains($0) }
            if let index { state.entries.remove(at: index) }
            state.entries.append(
                Entry(
                    seq: state.seq, id: id, rev: newRev, deleted: deleted, body: body,
                    channels: deleted ? [] : channels, removedFrom: deleted ? [] : removed))
            return newRev
        }
    }

    /// Sets the faults for the next feed responses.
    public func setFaults(_ faults: Faults) { state.withLock { $0.faults = faults } }

    /// Every feed open now stops writing anything (rows and heartbeats) but keeps its connection; new feeds
    /// behave normally.
    public func muteOpenFeeds() { state.withLock { $0.mutedBelow = $0.feedRequests.count } }

    /// Forgets the history: every `since` handed out so far becomes unknown to the server (400), except `0`.
    public func forgetHistory() {
        state.withLock { state in
            state.epoch += 1
            state.opaqueTable = [:]
            state.historyFloor = state.seq
        }
    }

    /// The `since` values of the feed requests received so far, in order.
    public var feedRequests: [String] { state.withLock { $0.feedRequests } }

    /// The query strings of the feed requests received so far (`feed=normal&since=0&limit=500`), in order.
    public var feedQueries: [String] { state.withLock { $0.feedQueries } }

    public var updateSeq: Int { state.withLock { $0.seq } }

    /// Makes every open feed end (the server is stopping).
    public func stop() { state.withLock { $0.stopped = true } }

    // MARK: - Sequences

    /// The JSON text of sequence `n` in this flavour.
    func render(_ n: Int, state: inout State) -> String {
        switch flavour {
        case .integer:
            return String(n)
        case .opaque:
            if n == 0 { return "\"0\"" }
            let text = "\(n)-g1AAAA" + Self.hash("epoch\(state.epoch)/\(n)") + Self.hash("\(n)/\(state.epoch)")
            state.opaqueTable[text] = n
            return "\"" + text + "\""
        case .syncGateway:
            // Every third sequence is written as a compound `low::seq`, as SG does while a lower one is pending.
            return n % 3 == 0 && n > 2 ? "\"\(n - 2)::\(n)\"" : String(n)
        }
    }

    enum Since: Equatable {
        case after(Int)
        case unknown
    }

    /// Reads a `since` query value as the servers do: the seq bare (`42`, `5-g1AAAA…`, `12::34`). A JSON-quoted
    /// string seq is malformed to CouchDB and Sync Gateway alike, so it is unknown here too.
    func parseSince(_ raw: String?, state: State) -> Since {
        guard let text = raw, !text.isEmpty else { return .after(0) }
        if text == "now" { return .after(state.seq) }
        if text == "0" { return .after(0) }
        switch flavour {
        case .integer:
            guard let n = Int(text), n >= 0 else { return .unknown }
            return n < state.historyFloor ? .unknown : .after(n)
        case .opaque:
            guard let n = state.opaqueTable[text] else { return .unknown }
            return .after(n)
        case .syncGateway:
            let parts = text.split(separator: ":", omittingEmptySubsequences: false)
            let last = parts.last.flatMap { Int($0) }
            guard let last, parts.count == 1 || parts.count == 3 || parts.count == 2, last >= 0 else { return .unknown }
            return last < state.historyFloor ? .unknown : .after(last)
        }
    }

    // MARK: - Rows

    struct Query {
        var includeDocs = false
        var filter: String?
        var channels: [String] = []
        var docIDs: [String]?
    }

    /// The row JSON of an entry, or nil when the filter leaves it out.
    func row(_ entry: Entry, query: Query, state: inout State) -> String? {
        var removed: [String] = []
        switch query.filter {
        case nil:
            break
        case "sync_gateway/bychannel" where flavour == .syncGateway:
            if !entry.channels.contains(where: query.channels.contains) {
                removed = entry.removedFrom.filter(query.channels.contains)
                if removed.isEmpty { return nil }
            }
        case "_doc_ids":
            guard query.docIDs?.contains(entry.id) == true else { return nil }
        case "_design":
            guard entry.id.hasPrefix("_design/") else { return nil }
        case "app/important":
            guard entry.body["important"] == .bool(true) else { return nil }
        default:
            return nil
        }
        var row: JSONObject = [:]
        let seq = render(entry.seq, state: &state)
        row["seq"] = (try? JSONParser().parse(seq)) ?? .null
        row["id"] = .string(entry.id)
        if !removed.isEmpty { row["removed"] = .array(removed.map(JSONValue.string)) }
        row["changes"] = [.object(["rev": .string(entry.rev)])]
        if entry.deleted { row["deleted"] = true }
        if query.includeDocs {
            if !removed.isEmpty {
                row["doc"] = .object(["_id": .string(entry.id), "_rev": .string(entry.rev), "_removed": true])
            } else {
                var doc: JSONObject = ["_id": .string(entry.id), "_rev": .string(entry.rev)]
                if entry.deleted { doc["_deleted"] = true }
                for (key, value) in entry.body.entries where doc[key] == nil { doc[key] = value }
                row["doc"] = .object(doc)
            }
        }
        return row.jsonString
    }

    /// Rows after `cursor` (at most `limit`), and the new cursor; entries the filter leaves out still advance it.
    func rows(after cursor: Int, query: Query, limit: Int?) -> Scan {
        state.withLock { state in
            var scan = Scan(rows: [], pending: 0, scannedTo: cursor)
            for entry in state.entries where entry.seq > cursor {
                if let limit, scan.rows.count >= limit {
                    scan.pending += 1
                    continue
                }
                scan.scannedTo = entry.seq
                if let json = row(entry, query: query, state: &state) {
                    scan.rows.append(Row(seq: entry.seq, json: json, seqJSON: render(entry.seq, state: &state)))
                }
            }
            return scan
        }
    }

    struct Row {
        var seq: Int
        var json: String
        var seqJSON: String
    }

    struct Scan {
        var rows: [Row]
        var pending: Int
        /// The highest sequence looked at (filtered-out entries included).
        var scannedTo: Int
    }

    static func hash(_ text: String) -> String {
        var value: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 {
            value ^= UInt64(byte)
            value = value &* 0x0000_0100_0000_01B3
        }
        let hex = String(value, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}
