import Bayeux
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization

/// PostgreSQL logical decoding through wal2json (format-version 2), read over an ordinary SQL connection:
/// `pg_logical_slot_peek_changes` to read without consuming, `pg_replication_slot_advance` to confirm once the
/// relay's checkpoint is durable. Creates the slot if it is missing. Needs a `LOGIN REPLICATION` role (or a
/// superuser), `wal_level=logical` and the wal2json plugin on the server.
public actor PostgresChangeSource: ChangeSource {
    public struct Configuration: Sendable {
        public var dsn: PostgresDSN
        public var slot: String
        /// Relayed tables as `schema.table`; changes of other tables are filtered out by wal2json.
        public var tables: [String]
        /// Upper bound of rows per peek (whole transactions are always returned).
        public var maxChangesPerPeek: Int
        public var connectTimeout: TimeAmount
        /// The longest wait for one query's answer before the connection is taken as lost.
        public var queryTimeout: TimeAmount

        /// The columns each table's routes read (`public.notes` → `owner_id`): checked at start against the
        /// table's replica identity, so that an update that moves a row and a delete can name their old audience.
        public var routedColumns: [String: Set<String>]

        public init(dsn: PostgresDSN, slot: String, tables: [String], maxChangesPerPeek: Int = 5000,
                    connectTimeout: TimeAmount = .seconds(5), queryTimeout: TimeAmount = .seconds(30),
                    routedColumns: [String: Set<String>] = [:]) {
            self.routedColumns = routedColumns
            self.dsn = dsn
            self.slot = slot
            self.tables = tables
            self.maxChangesPerPeek = maxChangesPerPeek
            self.connectTimeout = connectTimeout
            self.queryTimeout = queryTimeout
        }
    }

    public nonisolated let sourceID: String
    public let configuration: Configuration
    let logger: Logger
    private let eventLoopGroup: any EventLoopGroup
    private var connection: PostgresConnection?
    private var assembler = Wal2JSONAssembler(after: LSN(0))
    /// The slot's position as far as this source confirmed it.
    private var confirmed = LSN(0)
    /// Everything up to here is relayed and checkpointed (the start checkpoint, then each confirmed position).
    private var relayed: LSN?
    private var reconnectDelay = TimeAmount.milliseconds(100)
    /// Set while the relayed tables are read in full because changes between the checkpoint and the slot are lost.
    private var resync: Resync?

    /// A full resync: every row of every relayed table, read in pages ordered by primary key and published as an
    /// `update` with `resync: true`, before the slot's changes from `end` on. Until its last page the batches
    /// carry the old checkpoint, so a crash in the middle starts the resync over (the slot is then still ahead of
    /// the checkpoint); the last page carries `end`.
    private struct Resync {
        var reason: String
        var tables: [String]
        var offset = 0
        var primaryKey: [String]?
        var announced = false
        /// The checkpoint the resync started from (or the slot's position when there was none).
        var checkpoint: LSN
        /// The slot's position: where the changes go on after the resync.
        var end: LSN
    }

    public init(configuration: Configuration, logger: Logger,
                eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) {
        self.configuration = configuration
        self.sourceID = "pg:" + configuration.slot
        self.logger = logger
        self.eventLoopGroup = eventLoopGroup
    }

    /// Whether a slot name is one PostgreSQL accepts: lower-case letters, digits and underscores, at most 63.
    public static func isValidSlotName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= 63 && name.utf8.allSatisfy {
            ($0 >= UInt8(ascii: "a") && $0 <= UInt8(ascii: "z")) || ($0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9"))
                || $0 == UInt8(ascii: "_")
        }
    }

    /// No reading ahead: a peek decodes the WAL again from the slot's confirmed position, so a peek made while the
    /// previous batch is still being published (the slot not yet advanced) decodes that batch twice. Measured with
    /// `scripts/bench-relay`: 12,400 changes/s and p50 19.5 ms with read-ahead against 14,200 changes/s and
    /// p50 15.3 ms without.
    public nonisolated var readsAhead: Bool { false }

    /// Updates and deletes carry the old row as far as the replica identity holds it (checked at start for the
    /// routed columns).
    public nonisolated var givesPreviousValues: Bool { true }

    public func start(after position: String?) async throws {
        if let position {
            guard let lsn = LSN(position) else {
                throw RelayError(.source, "checkpoint position \(position) is not an LSN")
            }
            relayed = lsn
        }
        try await open()
    }

    /// Connects, creates or checks the slot, and moves it up to what was relayed (a slot rewinds after a server
    /// crash); used at start and after a lost connection.
    private func open() async throws {
        let checkpoint = relayed
        let connection = try await connect()
        self.connection = connection
        let identities = try await replicaIdentities(connection)

        var slot = try await readSlot(connection)
        var lostReason: String?
        if let found = slot, found.lost {
            // Its WAL was removed: the slot can never be read again. Start a new one and resync.
            lostReason = "replication slot \(configuration.slot) was lost (wal_status lost): its WAL was removed"
            try await connection.query("SELECT pg_drop_replication_slot(\(configuration.slot))", logger: logger)
            slot = nil
        }
        if slot == nil {
            let rows = try await connection.query(
                "SELECT lsn::text FROM pg_create_logical_replication_slot(\(configuration.slot), 'wal2json')",
                logger: logger)
            var created = "?"
            for try await lsn in rows.decode(String.self) { created = lsn }
            logger.notice("created replication slot", metadata: [
                "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.lsn": "\(created)"])
            if let checkpoint, lostReason == nil {
                lostReason = "replication slot \(configuration.slot) was missing although checkpoint \(checkpoint) exists"
            }
            slot = try await readSlot(connection)
        }
        guard let slot else { throw RelayError(.source, "replication slot \(configuration.slot) cannot be read") }
        guard slot.plugin == "wal2json" else {
            throw RelayError(
                .source, "replication slot \(configuration.slot) uses the plugin \(slot.plugin), not wal2json")
        }
        confirmed = slot.confirmed
        resync = nil
        if let checkpoint {
            if let lostReason {
                startResync(reason: lostReason + "; changes made since are lost", checkpoint: checkpoint, end: slot.confirmed)
            } else if checkpoint > slot.confirmed {
                // The server crashed after our last confirm and the slot went back: skip what it replays.
                try await advance(connection, to: checkpoint)
            } else if checkpoint < slot.confirmed {
                // Confirmed by someone else, or created anew by a resync that did not finish: the changes between
                // were never relayed.
                startResync(
                    reason: "replication slot \(configuration.slot) is at \(slot.confirmed), ahead of checkpoint \(checkpoint): the changes between were not relayed",
                    checkpoint: checkpoint, end: slot.confirmed)
            }
        } else if let lostReason {
            startResync(reason: lostReason, checkpoint: slot.confirmed, end: slot.confirmed)
        }
        assembler = Wal2JSONAssembler(after: max(checkpoint ?? LSN(0), confirmed))
        assembler.identityColumns = identities
    }

    private func startResync(reason: String, checkpoint: LSN, end: LSN) {
        logger.error("full resync of the relayed tables", metadata: [
            "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.reason": "\(reason)"])
        resync = Resync(reason: reason, tables: configuration.tables, checkpoint: checkpoint, end: end)
    }

    /// The next page of the resync: rows of the current table ordered by primary key (by physical position when
    /// the table has none).
    private func resyncPage(_ connection: PostgresConnection, _ state: Resync) async throws -> ChangeBatch {
        var state = state
        let limit = configuration.maxChangesPerPeek
        var changes: [Change] = []
        while changes.count < limit, let table = state.tables.first {
            let parts = table.split(separator: ".", maxSplits: 1).map(String.init)
            let quoted = parts.map(Self.quoteIdentifier).joined(separator: ".")
            let primaryKey: [String]
            if let known = state.primaryKey {
                primaryKey = known
            } else {
                primaryKey = try await primaryKeyColumns(connection, table: quoted)
                state.primaryKey = primaryKey
            }
            let order = primaryKey.isEmpty ? "ctid" : primaryKey.map { "t." + Self.quoteIdentifier($0) }.joined(separator: ", ")
            let pageSize = limit - changes.count
            let sql = "SELECT row_to_json(t)::text FROM ONLY \(quoted) t ORDER BY \(order) LIMIT \(pageSize) OFFSET \(state.offset)"
            let logger = logger
            let rows = try await Self.withDeadline(configuration.queryTimeout, connection) {
                let result = try await connection.query(PostgresQuery(unsafeSQL: sql), logger: logger)
                var rows: [String] = []
                for try await text in result.decode(String.self) { rows.append(text) }
                return rows
            }
            for text in rows {
                guard let object = try? JSONParser().parse(Array(text.utf8)).objectValue else {
                    throw RelayError(.source, "the server returned a row of \(table) that is not a JSON object")
                }
                let row = Wal2JSONRecord.RowChange(
                    operation: .update, schema: parts[0], table: parts[1],
                    columns: object.entries.map { Wal2JSONRecord.Column(name: $0.key, value: $0.value) },
                    identity: [], primaryKey: primaryKey)
                // A resync tells each row's audience of today only (`previous` is the row itself): whoever lost a
                // row during the gap learns it from its own full sync.
                changes.append(Change(
                    collection: parts, id: row.id, operation: .update, seq: state.end.description + ":resync",
                    document: row.document, extra: ["resync": .bool(true)], previous: row.document))
            }
            if rows.count < pageSize {
                state.tables.removeFirst()
                state.offset = 0
                state.primaryKey = nil
            } else {
                state.offset += rows.count
            }
        }
        let notice: PubSubRelay.Resync? = state.announced ? nil : PubSubRelay.Resync(reason: state.reason)
        state.announced = true
        if state.tables.isEmpty {
            resync = nil
            logger.notice("full resync read every row; following the slot again", metadata: [
                "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.lsn": "\(state.end)"])
            return ChangeBatch(changes: changes, position: state.end.description, resync: notice)
        }
        resync = state
        return ChangeBatch(changes: changes, position: state.checkpoint.description, resync: notice)
    }

    private func primaryKeyColumns(_ connection: PostgresConnection, table quoted: String) async throws -> [String] {
        let rows = try await connection.query(
            """
            SELECT a.attname::text FROM pg_index i \
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
            WHERE i.indrelid = \(quoted)::regclass AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)
            """, logger: logger)
        var names: [String] = []
        for try await name in rows.decode(String.self) { names.append(name) }
        return names
    }

    static func quoteIdentifier(_ name: String) -> String {
        "\"" + name.split(separator: "\"", omittingEmptySubsequences: false).joined(separator: "\"\"") + "\""
    }

    public func next() async throws -> ChangeBatch? {
        var current = connection
        if current == nil { current = try await reconnect() }
        guard let connection = current else { return nil }
        if connection.isClosed {
            // The server closed it (restart, crash, terminated backend); a query on it would wait forever.
            lostConnection(RelayError(.source, "connection closed by the server"))
            return nil
        }
        do {
            if let resync { return try await resyncPage(connection, resync) }
            return try await peek(connection)
        } catch {
            guard connection.isClosed || Self.endsTheConnection(error) else { throw error }
            if !connection.isClosed { try? await connection.close() }
            lostConnection(error)
            return nil
        }
    }

    private func peek(_ connection: PostgresConnection) async throws -> ChangeBatch? {
        let slot = configuration.slot
        let limit = Int32(clamping: configuration.maxChangesPerPeek)
        let tables = configuration.tables.joined(separator: ",")
        let logger = logger
        let fetched = try await Self.withDeadline(configuration.queryTimeout, connection) {
            let rows = try await connection.query(
                """
                SELECT lsn::text, data FROM pg_logical_slot_peek_changes(\(slot), NULL, \(limit), \
                'format-version', '2', 'include-pk', '1', 'include-xids', '1', 'include-lsn', '1', \
                'include-transaction', '1', 'include-timestamp', '1', 'add-tables', \(tables))
                """,
                logger: logger)
            var fetched: [(String, String)] = []
            for try await row in rows.decode((String, String).self) { fetched.append(row) }
            return fetched
        }
        var changes: [Change] = []
        var position: String?
        for (lsnText, data) in fetched {
            guard let lsn = LSN(lsnText) else { throw RelayError(.source, "the server returned a bad LSN \(lsnText)") }
            if let batch = try assembler.feed(lsn: lsn, data: data) {
                changes += batch.changes
                position = batch.position
            }
        }
        guard let position else { return nil }
        return ChangeBatch(changes: changes, position: position)
    }

    public func confirm(_ position: String) async throws {
        guard let lsn = LSN(position) else { throw RelayError(.source, "bad position \(position)") }
        relayed = max(relayed ?? lsn, lsn)
        guard lsn > confirmed, let connection, !connection.isClosed else { return }
        do {
            try await advance(connection, to: lsn)
        } catch {
            guard connection.isClosed || Self.endsTheConnection(error) else { throw error }
            if !connection.isClosed { try? await connection.close() }
            // The checkpoint is durable: the slot is advanced to it once connected again.
            lostConnection(error)
        }
    }

    private func lostConnection(_ error: any Error) {
        logger.warning("lost the connection to PostgreSQL; reconnecting", metadata: [
            "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.error": "\(Self.describe(error))"])
        connection = nil
        reconnectDelay = .milliseconds(100)
    }

    /// One reconnection attempt after a pause that doubles up to 5 s; nil (and a warning) when it failed.
    private func reconnect() async throws -> PostgresConnection? {
        try await Task.sleep(nanoseconds: UInt64(reconnectDelay.nanoseconds))
        do {
            try await open()
            logger.notice("reconnected to PostgreSQL", metadata: ["pubsub.relay.slot": "\(configuration.slot)"])
            return connection
        } catch {
            if let connection, !connection.isClosed { try? await connection.close() }
            connection = nil
            logger.warning("cannot reconnect to PostgreSQL", metadata: [
                "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.error": "\(error)"])
            reconnectDelay = min(reconnectDelay * 2, .seconds(5))
            return nil
        }
    }

    public func lag() async -> SourceLag? {
        guard let connection, !connection.isClosed else { return nil }
        let logger = logger
        let head = try? await Self.withDeadline(.seconds(5), connection) { () async throws -> String? in
            let rows = try await connection.query("SELECT pg_current_wal_lsn()::text", logger: logger)
            for try await text in rows.decode(String.self) { return text }
            return nil
        }
        guard let text = head ?? nil, let lsn = LSN(text) else { return nil }
        return SourceLag(amount: lsn.value &- min(lsn.value, assembler.after.value), unit: "WAL bytes")
    }

    public func close() async {
        if let connection {
            self.connection = nil
            try? await connection.close()
        }
    }

    // MARK: -

    private func connect() async throws -> PostgresConnection {
        var configuration: PostgresConnection.Configuration
        do {
            configuration = try self.configuration.dsn.configuration()
        } catch {
            throw RelayError(.source, "cannot set up TLS to PostgreSQL at \(self.configuration.dsn.endpoint): \(error)")
        }
        configuration.options.connectTimeout = self.configuration.connectTimeout
        do {
            return try await PostgresConnection.connect(
                on: eventLoopGroup.next(), configuration: configuration, id: 1, logger: logger
            ).get()
        } catch let error as PSQLError {
            throw RelayError(
                .source, "cannot connect to PostgreSQL at \(self.configuration.dsn.endpoint): \(Self.describe(error))")
        } catch {
            throw RelayError(.source, "cannot connect to PostgreSQL at \(self.configuration.dsn.endpoint): \(error)")
        }
    }

    private struct SlotInfo {
        var plugin: String
        var confirmed: LSN
        var lost: Bool
    }

    private func readSlot(_ connection: PostgresConnection) async throws -> SlotInfo? {
        let rows = try await connection.query(
            """
            SELECT coalesce(plugin, ''), coalesce(confirmed_flush_lsn, '0/0')::text, coalesce(wal_status, '') \
            FROM pg_replication_slots WHERE slot_name = \(configuration.slot)
            """, logger: logger)
        for try await (plugin, lsn, status) in rows.decode((String, String, String).self) {
            return SlotInfo(plugin: plugin, confirmed: LSN(lsn) ?? LSN(0), lost: status == "lost")
        }
        return nil
    }

    private func advance(_ connection: PostgresConnection, to lsn: LSN) async throws {
        let (slot, logger) = (configuration.slot, logger)
        try await Self.withDeadline(configuration.queryTimeout, connection) {
            try await connection.query(
                "SELECT pg_replication_slot_advance(\(slot), \(lsn.description)::pg_lsn)", logger: logger)
            return ()
        }
        confirmed = lsn
    }

    /// Runs a query, giving up after `timeout`: the connection is then closed (a dead peer that sent nothing is
    /// noticed) and the caller treats it as lost.
    static func withDeadline<T: Sendable>(
        _ timeout: TimeAmount, _ connection: PostgresConnection, _ body: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        let done = Once()
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let work = Task {
                let result: Result<T, any Error>
                do { result = .success(try await body()) } catch { result = .failure(error) }
                if done.claim() { continuation.resume(with: result) }
            }
            Task {
                try? await Task.sleep(nanoseconds: UInt64(timeout.nanoseconds))
                guard done.claim() else { return }
                work.cancel()
                try? await connection.close()
                let seconds = timeout.nanoseconds / 1_000_000_000
                continuation.resume(throwing: RelayError(.source, "no answer from PostgreSQL within \(seconds) s"))
            }
        }
    }

    /// Whether `error` means the connection is gone even if it is not marked closed yet: a crash or shutdown of
    /// the server answers the query in flight with an error (SQLSTATE class 57P, operator intervention, or 08,
    /// connection exception) just before the socket closes.
    static func endsTheConnection(_ error: any Error) -> Bool {
        guard let error = error as? PSQLError else { return false }
        switch error.code {
        case .serverClosedConnection, .connectionError, .uncleanShutdown, .clientClosedConnection:
            return true
        case .server:
            let state = error.serverInfo?[.sqlState] ?? ""
            return state.hasPrefix("57P") || state.hasPrefix("08")
        default:
            return false
        }
    }

    /// The server's message of a PostgreSQL error, else the error's code; another error as `FeedTLS` says it.
    public static func describe(_ error: any Error) -> String {
        guard let error = error as? PSQLError else { return FeedTLS.describe(error) }
        if let message = error.serverInfo?[.message] { return message }
        if let underlying = error.underlying { return "\(underlying)" }
        return "\(error.code)"
    }
}

extension PostgresChangeSource {
    public nonisolated func describe(_ error: any Error) -> String { Self.describe(error) }
}

/// True for the first caller only.
private final class Once: Sendable {
    private let flag = Mutex(false)
    func claim() -> Bool {
        flag.withLock { claimed in
            defer { claimed = true }
            return !claimed
        }
    }
}
