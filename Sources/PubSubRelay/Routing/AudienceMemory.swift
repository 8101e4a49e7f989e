import Bayeux
import NIOConcurrencyHelpers
import NIOCore

/// The routed values each document had when the relay last saw it, for the sources whose feed does not give a
/// change's old values (CouchDB `_changes`, Sync Gateway, Simperium): a tombstone has no fields and an update carries
/// only the new document, so a delete and a move are routed by what is remembered here.
///
/// - Bounded: at most `limit` documents, the least recently changed forgotten first. A document forgotten (or one
///   changed before the relay first ran) that is then deleted or moved cannot name its old audience: the change
///   is counted as `no_previous` and logged, and its new audience (if any) is still told.
/// - Persisted beside the checkpoint (`<checkpoint>.audience`), written durably after the broker acknowledged a
///   batch and before the checkpoint moves, so after a crash it is never behind the checkpoint. Only the routed
///   fields are kept (`{"owner": "u1"}`), not the documents.
final class AudienceMemory: Sendable {
    struct Entries {
        var values: [String: (generation: UInt64, row: JSONObject)] = [:]
        var order = CircularBuffer<(key: String, generation: UInt64)>()
        var generation: UInt64 = 0
        var dirty = false
    }

    let limit: Int
    let path: String?
    private let state = NIOLockedValueBox(Entries())

    init(limit: Int, path: String?) {
        self.limit = max(1, limit)
        self.path = path
    }

    static func key(_ change: Change) -> String? {
        change.id.map { change.collection.joined(separator: ".") + "\u{0}" + $0 }
    }

    var count: Int { state.withLockedValue { $0.values.count } }

    func previous(of change: Change) -> JSONObject? {
        guard let key = Self.key(change) else { return nil }
        return state.withLockedValue { $0.values[key]?.row }
    }

    /// Keeps what `routes` read of the change's new document (every routed field, NULL included, so that a field
    /// the document lacks is known to be NULL); forgets a deleted document.
    func remember(_ change: Change, routes: [Route]) {
        guard let key = Self.key(change) else { return }
        state.withLockedValue { s in
            s.dirty = true
            guard change.operation != .delete, let document = change.document else {
                s.values[key] = nil
                return
            }
            var row = JSONObject()
            for route in routes {
                for field in route.fields where row[field.path[0]] == nil {
                    row[field.path[0]] = document[field.path[0]] ?? .null
                }
            }
            s.generation += 1
            s.values[key] = (s.generation, row)
            s.order.append((key, s.generation))
            while s.values.count > limit, let oldest = s.order.popFirst() {
                if s.values[oldest.key]?.generation == oldest.generation { s.values[oldest.key] = nil }
            }
            if s.order.count > 2 * limit + 64 {
                s.order = CircularBuffer(s.order.filter { s.values[$0.key]?.generation == $0.generation })
            }
        }
    }

    // MARK: Persistence

    /// Reads the file, if any: `{"entries": [[key, row], …]}`, oldest first.
    func load() throws {
        guard let path else { return }
        let bytes: [UInt8]
        do {
            guard let read = try RelayFile.contents(of: path, limit: 256 << 20, missingIsNil: true) else { return }
            bytes = read
        } catch let error as RelayError {
            throw RelayError(.checkpoint, error.message)
        }
        guard let object = try? JSONParser(maxDepth: 64).parse(bytes).objectValue,
              let entries = object["entries"]?.arrayValue
        else { throw RelayError(.checkpoint, "\(path) is not the relay's audience memory") }
        state.withLockedValue { s in
            s = Entries()
            for entry in entries {
                guard let pair = entry.arrayValue, pair.count == 2, let key = pair[0].stringValue,
                      let row = pair[1].objectValue
                else { continue }
                s.generation += 1
                s.values[key] = (s.generation, row)
                s.order.append((key, s.generation))
            }
            while s.values.count > limit, let oldest = s.order.popFirst() {
                if s.values[oldest.key]?.generation == oldest.generation { s.values[oldest.key] = nil }
            }
        }
    }

    /// Writes the file durably when something changed since the last save.
    func save() throws {
        guard let path else { return }
        let text: String? = state.withLockedValue { s in
            guard s.dirty else { return nil }
            s.dirty = false
            var entries: [JSONValue] = []
            entries.reserveCapacity(s.values.count)
            for item in s.order where s.values[item.key]?.generation == item.generation {
                entries.append(.array([.string(item.key), .object(s.values[item.key]!.row)]))
            }
            return JSONObject(dictionaryLiteral: ("entries", .array(entries))).jsonString
        }
        guard let text else { return }
        do {
            try DurableFile.replace(path, with: Array(text.utf8), durable: true)
        } catch {
            state.withLockedValue { $0.dirty = true }
            throw RelayError(.checkpoint, "cannot write \(path): \(error)")
        }
    }
}
