import Bayeux
import NIOConcurrencyHelpers
import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The routed values each document had when the relay last saw it, for the sources whose feed does not give a
/// change's old values (CouchDB `_changes`, Sync Gateway, Simperium): a tombstone has no fields and an update carries
/// only the new document, so a delete and a move are routed by what is remembered here.
///
/// - Bounded: at most `limit` documents, the least recently changed forgotten first. A document forgotten (or one
///   changed before the relay first ran) that is then deleted or moved cannot name its old audience: the change
///   is counted as `no_previous` and logged, and its new audience (if any) is still told.
/// - Persisted beside the checkpoint as a journal: `save()`, called after the broker acknowledged a batch and before
///   the checkpoint moves, appends that batch's entries to `<checkpoint>.audience.journal-<epoch>` and fsyncs it, so
///   after a crash the memory is never behind the checkpoint, and a batch costs what it changed, not the size of the
///   memory. Once the journal holds more lines than the memory has documents, a compaction writes the memory as it
///   was at that save into `<checkpoint>.audience` (temp file, fsync, rename) in the background, marked with the next
///   epoch, while later batches append to the next epoch's journal; then the older journals are removed. Loading
///   reads the snapshot, then replays the journals of its epoch and later, in order. Only the routed fields are kept
///   (`{"owner": "u1"}`), not the documents.
final class AudienceMemory: Sendable {
    struct Entries {
        var values: [String: (generation: UInt64, row: JSONObject)] = [:]
        var order = CircularBuffer<(key: String, generation: UInt64)>()
        var generation: UInt64 = 0
        /// What changed since the last save, in order: a row remembered, or nil for a document forgotten.
        var pending: [(key: String, row: JSONObject?)] = []
        /// The journal new entries go to, and how many lines it holds.
        var epoch: UInt64 = 0
        var journalLines = 0
        var journalExists = false
        var compacting = false
        /// Why the last compaction failed, thrown by the next save.
        var compactionError: RelayError?
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
        let persisted = path != nil
        state.withLockedValue { s in
            guard change.operation != .delete, let document = change.document else {
                s.values[key] = nil
                if persisted { s.pending.append((key, nil)) }
                return
            }
            var row = JSONObject()
            for route in routes {
                for field in route.fields where row[field.path[0]] == nil {
                    row[field.path[0]] = document[field.path[0]] ?? .null
                }
            }
            Self.put(&s, key: key, row: row, limit: limit)
            if persisted { s.pending.append((key, row)) }
        }
    }

    private static func put(_ s: inout Entries, key: String, row: JSONObject, limit: Int) {
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

    // MARK: Persistence

    func journalPath(_ epoch: UInt64) -> String? { path.map { "\($0).journal-\(epoch)" } }

    /// Reads the snapshot (`{"epoch": E, "entries": [[key, row], …]}`, oldest first), then the journals of epoch E
    /// and later (one `[key, row]` or `[key, null]` per line); removes older journals, which the snapshot holds.
    func load() throws {
        guard let path else { return }
        var snapshotEpoch: UInt64 = 0
        var loaded = Entries()
        if let bytes = try Self.read(path) {
            guard let object = try? JSONParser(maxDepth: 64).parse(bytes).objectValue,
                let entries = object["entries"]?.arrayValue
            else { throw RelayError(.checkpoint, "\(path) is not the relay's audience memory") }
            snapshotEpoch = object["epoch"]?.integerValue.flatMap { UInt64(exactly: $0) } ?? 0
            for entry in entries {
                guard let pair = entry.arrayValue, pair.count == 2, let key = pair[0].stringValue,
                    let row = pair[1].objectValue
                else { continue }
                Self.put(&loaded, key: key, row: row, limit: limit)
            }
        }
        loaded.epoch = snapshotEpoch
        for epoch in journalEpochs() {
            guard let journal = journalPath(epoch) else { continue }
            if epoch < snapshotEpoch {
                unlink(journal)
                continue
            }
            guard let bytes = try Self.read(journal) else { continue }
            var lines = 0
            for line in bytes.split(separator: UInt8(ascii: "\n")) {
                // A line cut short by a crash in the middle of an append was never fsynced as part of a save:
                // it belongs to a batch that was not checkpointed, and the lines after it cannot exist.
                guard let pair = (try? JSONParser(maxDepth: 64).parse(Array(line)))?.arrayValue, pair.count == 2,
                    let key = pair[0].stringValue
                else { break }
                lines += 1
                if let row = pair[1].objectValue {
                    Self.put(&loaded, key: key, row: row, limit: limit)
                } else {
                    loaded.values[key] = nil
                }
            }
            loaded.epoch = epoch
            loaded.journalLines = lines
            loaded.journalExists = true
        }
        state.withLockedValue { $0 = loaded }
    }

    /// The epochs of the journals beside the snapshot, ascending.
    private func journalEpochs() -> [UInt64] {
        guard let path else { return [] }
        let folder = DurableFile.directory(of: path)
        let prefix = String(path.split(separator: "/").last ?? "") + ".journal-"
        guard let dir = opendir(folder) else { return [] }
        defer { closedir(dir) }
        var epochs: [UInt64] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name.hasPrefix(prefix), let epoch = UInt64(name.dropFirst(prefix.count)) { epochs.append(epoch) }
        }
        return epochs.sorted()
    }

    private static func read(_ path: String) throws -> [UInt8]? {
        do {
            return try RelayFile.contents(of: path, limit: 256 << 20, missingIsNil: true)
        } catch let error as RelayError {
            throw RelayError(.checkpoint, error.message)
        }
    }

    /// Appends what changed since the last save to the journal and fsyncs it (the cost of the batch, not of the
    /// memory); starts a compaction in the background once the journal outgrew the memory.
    func save() throws {
        guard let path else { return }
        let (pending, epoch, create, failure) = state.withLockedValue { s in
            defer {
                s.pending = []
                s.compactionError = nil
            }
            return (s.pending, s.epoch, !s.journalExists, s.compactionError)
        }
        if let failure { throw failure }
        guard !pending.isEmpty else { return }
        var text = ""
        for (key, row) in pending {
            text += JSONValue.array([.string(key), row.map(JSONValue.object) ?? .null]).jsonString
            text += "\n"
        }
        do {
            try Self.append(Array(text.utf8), to: journalPath(epoch)!, create: create)
        } catch {
            // Written again whole at the next save (a replayed line is harmless: the last one wins).
            state.withLockedValue { $0.pending = pending + $0.pending }
            throw RelayError(.checkpoint, "cannot write \(journalPath(epoch)!): \(error)")
        }
        if create, access(path, F_OK) != 0 {
            // The snapshot exists from the first save on (empty until the first compaction).
            try? DurableFile.replace(path, with: Array(#"{"epoch":0,"entries":[]}"#.utf8), durable: true)
        }
        let snapshot: (entries: Entries, epoch: UInt64)? = state.withLockedValue { s in
            s.journalExists = true
            s.journalLines += pending.count
            guard !s.compacting, s.journalLines > max(s.values.count, 1024) else { return nil }
            // The memory as acknowledged at this save; what comes next goes to the next journal.
            s.compacting = true
            s.epoch += 1
            s.journalLines = 0
            s.journalExists = false
            return (s, s.epoch)
        }
        guard let snapshot else { return }
        Task.detached { [self] in self.compact(snapshot.entries, epoch: snapshot.epoch, path: path) }
    }

    /// Writes `entries` durably as the snapshot of `epoch`, then removes the journals before it.
    private func compact(_ entries: Entries, epoch: UInt64, path: String) {
        var items: [JSONValue] = []
        items.reserveCapacity(entries.values.count)
        for item in entries.order where entries.values[item.key]?.generation == item.generation {
            items.append(.array([.string(item.key), .object(entries.values[item.key]!.row)]))
        }
        let text = JSONObject(dictionaryLiteral: ("epoch", .number(String(epoch))), ("entries", .array(items)))
            .jsonString
        var failure: RelayError?
        do {
            try DurableFile.replace(path, with: Array(text.utf8), durable: true)
            for old in journalEpochs() where old < epoch {
                if let journal = journalPath(old) { unlink(journal) }
            }
        } catch {
            failure = RelayError(.checkpoint, "cannot write \(path): \(error)")
        }
        state.withLockedValue { s in
            s.compacting = false
            if let failure { s.compactionError = failure }
        }
    }

    /// Whether a compaction is running (tests wait for it).
    var isCompacting: Bool { state.withLockedValue { $0.compacting } }

    /// Appends `bytes` to `path` and fsyncs it (and its folder when it was created).
    private static func append(_ bytes: [UInt8], to path: String, create: Bool) throws {
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        if fd < 0 { throw DurableFile.Error(.create, path: path, code: errno) }
        defer { close(fd) }
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { throw DurableFile.Error(.write, path: path, code: errno) }
            offset += n
        }
        if fsync(fd) != 0 { throw DurableFile.Error(.sync, path: path, code: errno) }
        guard create else { return }
        let folderPath = DurableFile.directory(of: path)
        let folder = open(folderPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if folder < 0 { throw DurableFile.Error(.openDirectory, path: folderPath, code: errno) }
        defer { close(folder) }
        if fsync(folder) != 0 && errno != EINVAL {
            throw DurableFile.Error(.syncDirectory, path: folderPath, code: errno)
        }
    }
}
