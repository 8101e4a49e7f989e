import Bayeux
import NIOCore

/// One row of a `_changes` feed: `{"seq":S,"id":"doc","changes":[{"rev":"2-abc"}],"deleted":true?,
/// "removed":["channel"]? (Sync Gateway),"doc":{…}?}`.
public struct CouchDBRow: Sendable, Equatable {
    /// The row's `seq` as it is sent back in `since=` (`42`, `5-g1AAAA…`, `12::34`): a string seq without its
    /// JSON quotes, any other seq as its JSON text.
    public var seq: String
    public var id: String
    /// The winning revision (`changes[0].rev`), when the row has one.
    public var rev: String?
    public var deleted: Bool
    /// Sync Gateway: the channels the document left (it is no longer visible through them).
    public var removed: [String]?
    public var doc: JSONObject?

    public init(
        seq: String, id: String, rev: String?, deleted: Bool = false, removed: [String]? = nil,
        doc: JSONObject? = nil
    ) {
        self.seq = seq
        self.id = id
        self.rev = rev
        self.deleted = deleted
        self.removed = removed
        self.doc = doc
    }

    /// The change this row stands for: `deleted` or `removed` → delete (with `extra.removed` holding the channels),
    /// revision generation 1 → insert, else update; `extra.rev` holds the revision.
    public func change(collection: [String], resync: Bool = false) -> Change {
        let operation: Change.Operation
        if deleted || removed != nil {
            operation = .delete
        } else if let rev, rev.hasPrefix("1-") {
            operation = .insert
        } else {
            operation = .update
        }
        var extra: JSONObject = [:]
        if let rev { extra["rev"] = .string(rev) }
        if let removed { extra["removed"] = .array(removed.map(JSONValue.string)) }
        if resync { extra["resync"] = true }
        return Change(collection: collection, id: id, operation: operation, seq: seq, document: doc, extra: extra)
    }
}

/// What one unit of a feed says.
public enum CouchDBFeedEvent: Sendable, Equatable {
    case row(CouchDBRow)
    /// The end of a feed (`{"last_seq":S,"pending":N}`); `pending` counts rows still to read (CouchDB 2+).
    case end(lastSeq: String, pending: UInt64?)
    case heartbeat
}

public enum CouchDBFeedParser {
    /// The longest line (or event) accepted; a row with a large `doc` fits, a stream without newlines does not.
    public static let maxLine = 64 << 20

    /// Reads one JSON object of a feed: a row, or the final `last_seq` object.
    public static func event(_ value: JSONValue) throws -> CouchDBFeedEvent {
        guard let object = value.objectValue else { throw RelayError(.feed, "a _changes row is not a JSON object") }
        if object["id"] == nil, let lastSeq = object["last_seq"] {
            return .end(lastSeq: sinceText(lastSeq), pending: pending(object))
        }
        return .row(try row(object))
    }

    public static func row(_ object: JSONObject) throws -> CouchDBRow {
        guard let seq = object["seq"], !seq.isNull else { throw RelayError(.feed, "a _changes row has no seq") }
        guard let id = object["id"]?.stringValue else { throw RelayError(.feed, "a _changes row has no string id") }
        let rev = object["changes"]?.arrayValue?.first?.objectValue?["rev"]?.stringValue
        var removed: [String]?
        if let array = object["removed"]?.arrayValue {
            removed = array.compactMap(\.stringValue)
        }
        return CouchDBRow(
            seq: sinceText(seq), id: id, rev: rev, deleted: object["deleted"] == .bool(true),
            removed: removed, doc: object["doc"]?.objectValue)
    }

    static func pending(_ object: JSONObject) -> UInt64? {
        object["pending"]?.integerValue.flatMap { $0 >= 0 ? UInt64($0) : nil }
    }

    /// A whole `normal`/`longpoll` body, `{"results":[…],"last_seq":S,"pending":N?}`, heartbeat newlines included
    /// (they are JSON whitespace).
    public static func list(_ bytes: [UInt8]) throws -> (rows: [CouchDBRow], lastSeq: String, pending: UInt64?) {
        let value: JSONValue
        do {
            value = try JSONParser().parse(bytes)
        } catch {
            throw RelayError(.feed, "malformed _changes body: \(error)")
        }
        guard let object = value.objectValue, let results = object["results"]?.arrayValue,
            let lastSeq = object["last_seq"]
        else { throw RelayError(.feed, "a _changes body without results and last_seq") }
        let rows = try results.map { result in
            guard let row = result.objectValue else { throw RelayError(.feed, "a _changes row is not a JSON object") }
            return try Self.row(row)
        }
        return (rows, sinceText(lastSeq), pending(object))
    }

    /// A seq as it goes back in `since=`: a string seq bare (`5-g1AAAA…`, `12::34`, as CouchDB 2+, Cloudant and
    /// Sync Gateway expect it, and as their own clients send it), anything else (an integer, a CouchDB 1.x/BigCouch
    /// array) as its JSON text.
    public static func sinceText(_ seq: JSONValue) -> String {
        seq.stringValue ?? seq.jsonString
    }
}

/// Splits a byte stream into lines on `\n`, dropping a trailing `\r` (CouchDB's docs say CRLF, its code writes LF).
public struct LineSplitter: Sendable {
    private var partial: [UInt8] = []

    public init() {}

    /// Whether bytes of an unfinished line are held (a stream that ends here was cut mid-line).
    public var hasPartialLine: Bool { !partial.isEmpty }

    public mutating func feed(_ buffer: ByteBuffer) throws -> [[UInt8]] {
        var lines: [[UInt8]] = []
        buffer.withUnsafeReadableBytes { bytes in
            var start = 0
            for (index, byte) in bytes.enumerated() where byte == UInt8(ascii: "\n") {
                partial.append(contentsOf: bytes[start..<index])
                if partial.last == UInt8(ascii: "\r") { partial.removeLast() }
                lines.append(partial)
                partial.removeAll(keepingCapacity: true)
                start = index + 1
            }
            partial.append(contentsOf: bytes[start...])
        }
        if partial.count > CouchDBFeedParser.maxLine {
            throw RelayError(.feed, "a _changes line longer than \(CouchDBFeedParser.maxLine) bytes")
        }
        return lines
    }
}

/// `feed=continuous`: one JSON row per line, an empty line as the heartbeat, `{"last_seq":…}` last.
public struct ContinuousFeedParser: Sendable {
    public var lines = LineSplitter()

    public init() {}

    public mutating func feed(_ buffer: ByteBuffer) throws -> [CouchDBFeedEvent] {
        try lines.feed(buffer).map { line in
            if line.allSatisfy({ $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }) { return .heartbeat }
            let value: JSONValue
            do {
                value = try JSONParser().parse(line)
            } catch {
                throw RelayError(.feed, "malformed _changes line: \(error)")
            }
            return try CouchDBFeedParser.event(value)
        }
    }
}

/// `feed=eventsource` (Server-Sent Events): `data: <row>\nid: <seq>\n\n` per change,
/// `event: heartbeat\ndata: \n\n` as the heartbeat; `:` comments and unknown fields are ignored.
public struct EventSourceFeedParser: Sendable {
    public var lines = LineSplitter()
    private var data: [UInt8] = []
    private var hasData = false
    private var eventType = ""
    private var lastID: String?

    public init() {}

    public mutating func feed(_ buffer: ByteBuffer) throws -> [CouchDBFeedEvent] {
        var events: [CouchDBFeedEvent] = []
        for line in try lines.feed(buffer) {
            if line.isEmpty {
                if let event = try dispatch() { events.append(event) }
                continue
            }
            if line.first == UInt8(ascii: ":") { continue }
            let colon = line.firstIndex(of: UInt8(ascii: ":")) ?? line.endIndex
            let field = String(decoding: line[..<colon], as: UTF8.self)
            var value = colon < line.endIndex ? line[(colon + 1)...] : []
            if value.first == UInt8(ascii: " ") { value = value.dropFirst() }
            switch field {
            case "data":
                if hasData { data.append(UInt8(ascii: "\n")) }
                data.append(contentsOf: value)
                hasData = true
            case "id":
                lastID = String(decoding: value, as: UTF8.self)
            case "event":
                eventType = String(decoding: value, as: UTF8.self)
            default:
                break
            }
            if data.count > CouchDBFeedParser.maxLine {
                throw RelayError(.feed, "an event longer than \(CouchDBFeedParser.maxLine) bytes")
            }
        }
        return events
    }

    private mutating func dispatch() throws -> CouchDBFeedEvent? {
        defer {
            data.removeAll(keepingCapacity: true)
            hasData = false
            eventType = ""
        }
        if eventType == "heartbeat" { return .heartbeat }
        let trimmed = data.drop { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\n") }
        guard hasData, !trimmed.isEmpty else { return eventType.isEmpty ? nil : .heartbeat }
        let value: JSONValue
        do {
            value = try JSONParser().parse(trimmed)
        } catch {
            throw RelayError(.feed, "malformed event data: \(error)")
        }
        guard var object = value.objectValue else { throw RelayError(.feed, "event data is not a JSON object") }
        if object["seq"] == nil, object["id"] != nil, let lastID, let seq = try? JSONParser().parse(lastID) {
            object["seq"] = seq
        }
        return try CouchDBFeedParser.event(.object(object))
    }
}
