import Bayeux
import CoreMetrics
import Logging
import NIOCore
import NIOPosix
import PostgresNIO

/// PostgreSQL logical decoding. Needs a `LOGIN REPLICATION` role (or a superuser) and `wal_level=logical`.
/// Creates the slot if it is missing. Two ways to read it:
///
/// - **pgoutput** (the default), the plugin built into every PostgreSQL since 10: the slot is streamed over a
///   replication connection (`START_REPLICATION … LOGICAL`, `ReplicationStateMachine`), through a publication of
///   the relayed tables (created if missing). The server pushes each transaction as it commits; the standby status
///   confirms only what the relay checkpointed, and keepalives move the slot past WAL of other tables. An ordinary
///   SQL connection (postgres-nio) beside it checks the slot, reads a resync and the server's WAL head.
/// - **wal2json** (format-version 2), for existing slots of that plugin, read over an ordinary SQL connection:
///   `pg_logical_slot_peek_changes` to read without consuming, `pg_replication_slot_advance` to confirm once the
///   relay's checkpoint is durable. PostgreSQL 15.19 and later load it only when `output_plugin_libraries` names
///   it. The slot is pulled: the shared reader (`PushFeed.startPolling`) polls it, rests `pollInterval` when a peek
///   drained it, reconnects with its backoff, and hands batches to the relay while the rest of the same peek is
///   read. Before each peek it waits for the relay's acknowledgement of every batch handed over, and the peek first
///   advances the slot to what the relay confirmed (whole transactions only).
///
/// Both give the same changes, data and positions.
public actor PostgresChangeSource: ChangeSource {
    /// The logical decoding plugin of the slot.
    public enum Plugin: String, Sendable, CaseIterable {
        case pgoutput
        case wal2json
    }

    public struct Configuration: Sendable {
        public var dsn: PostgresDSN
        public var slot: String
        public var plugin: Plugin = .pgoutput
        /// The publication pgoutput reads (nil: `pubsub_<slot>`, created for the relayed tables when missing; a
        /// named one must exist and hold them).
        public var publication: String?
        /// The longest message the replication stream may carry (one row change is one message).
        public var maxMessageSize = 256 << 20
        /// The slot lag (WAL bytes between the server's head and the confirmed position) above which the relay
        /// says it is behind.
        public var behindBytes: UInt64 = 64 << 20
        /// Relayed tables as `schema.table`; changes of other tables are filtered out by wal2json.
        public var tables: [String]
        /// Most changes per batch: a transaction larger than this is read, published and checkpointed in pieces of
        /// this many changes (the rows of a peek are read as they are needed, never all at once).
        public var maxChangesPerPeek: Int
        public var connectTimeout: TimeAmount
        /// The longest wait for one query's answer before the connection is taken as lost.
        public var queryTimeout: TimeAmount
        /// The rest after a peek that drained the slot (one that was full is followed by the next at once).
        public var pollInterval: TimeAmount

        /// The columns each table's routes read (`public.notes` → `owner_id`): checked at start against the
        /// table's replica identity, so that an update that moves a row and a delete can name their old audience.
        public var routedColumns: [String: Set<String>]

        public init(
            dsn: PostgresDSN, slot: String, tables: [String], maxChangesPerPeek: Int = 5000,
            connectTimeout: TimeAmount = .seconds(5), queryTimeout: TimeAmount = .seconds(30),
            pollInterval: TimeAmount = .milliseconds(100), routedColumns: [String: Set<String>] = [:]
        ) {
            self.pollInterval = pollInterval
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
    /// The replication stream's machine and channel while one is open (pgoutput).
    var machine: ReplicationStateMachine?
    var replication: (any NIOCore.Channel)?
    /// Why a confirmation or a tick ended the stream (the reader throws it once the stream is over).
    var streamFailure: (any Error)?
    /// The pgoutput stream's assembler, made anew for each connection.
    var streamAssembler = PgOutputAssembler(after: PostgresPosition(lsn: LSN(0)), limit: 1)
    /// Each relayed table's primary key columns (pgoutput), read by `open()`.
    var primaryKeys: [String: [String]] = [:]
    /// The first connection is opened by `start`; the reader's later ones open their own.
    var opened = false
    /// When a keepalive last moved the position past WAL the relay has no use for.
    var lastProgress = NIODeadline.uptimeNanoseconds(0)
    var lastKeepalive: NIODeadline?
    var lastHeadRead = NIODeadline.uptimeNanoseconds(0)
    var readingHead = false
    var behind = false
    let metrics: PostgresSourceMetrics
    private let eventLoopGroup: any EventLoopGroup
    var connection: PostgresConnection?
    var assembler = Wal2JSONAssembler(after: LSN(0))
    /// The slot's position as far as this source confirmed it.
    var confirmed = LSN(0)
    /// Everything up to here is relayed and checkpointed (the start checkpoint, then each confirmed position); it
    /// may point inside a transaction.
    var relayed: PostgresPosition?
    /// The rows of the peek being read, kept open across batches: a transaction larger than a batch is handed out
    /// in pieces as its rows arrive (postgres-nio reads the socket only as rows are consumed, so at most a socket
    /// read's worth waits in memory). Nil between peeks.
    private var stream: PostgresRowSequence.AsyncIterator?
    /// Rows the current peek returned so far: as many as its limit means the slot may hold more.
    private var peekRows = 0
    /// Set when a progress line asked for the lag: the reader reads the server's WAL head before its next peek (the
    /// connection is the reader's: a query from the relay's task could wait behind a peek whose rows wait for the
    /// relay).
    private var wantsHead = false
    /// The server's WAL head as the reader last read it.
    var head: LSN?
    /// The reader that polls the slot, and the stream through which it hands batches to the relay (one batch waits
    /// while one is published, so that at most two batches of a large transaction are held).
    nonisolated let feed = PushFeed(capacity: 1)
    /// The wait for a peek's first rows: PostgreSQL decodes a whole transaction before it sends any of its rows, so
    /// a very large one may take longer than `queryTimeout`. Doubles after each peek that timed out (up to 30
    /// minutes), back to `queryTimeout` after one that answered: a large transaction is never retried forever
    /// with a wait too short for it.
    private var peekTimeout: TimeAmount
    /// Set while the relayed tables are read in full because changes between the checkpoint and the slot are lost.
    var resync: Resync?

    /// A full resync: every row of every relayed table, read in pages ordered by primary key and published as an
    /// `update` with `resync: true`, before the slot's changes from `end` on. Until its last page the batches
    /// carry the old checkpoint, so a crash in the middle starts the resync over (the slot is then still ahead of
    /// the checkpoint); the last page carries `end`.
    ///
    /// Pages are read by key (`WHERE key > last ORDER BY key LIMIT n`), never by OFFSET: a row deleted or inserted
    /// behind the resync does not shift the next page (an OFFSET would skip a row for each one deleted before it),
    /// so every row that exists throughout is sent, and each page costs its own rows, not the rows before it.
    struct Resync {
        var reason: String
        var tables: [String]
        /// The current table's key (nil until read), and the key of the last row sent from it (nil: none yet).
        var key: ResyncKey?
        var last: [String]?
        var announced = false
        /// The checkpoint the resync started from (or the slot's position when there was none).
        var checkpoint: PostgresPosition
        /// The slot's position: where the changes go on after the resync.
        var end: LSN
    }

    public init(
        configuration: Configuration, logger: Logger,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) {
        self.configuration = configuration
        self.sourceID = "pg:" + configuration.slot
        self.logger = logger
        self.eventLoopGroup = eventLoopGroup
        self.peekTimeout = configuration.queryTimeout
        self.metrics = PostgresSourceMetrics(source: sourceID)
    }

    /// Whether a slot name is one PostgreSQL accepts: lower-case letters, digits and underscores, at most 63.
    public static func isValidSlotName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= 63
            && name.utf8.allSatisfy {
                ($0 >= UInt8(ascii: "a") && $0 <= UInt8(ascii: "z"))
                    || ($0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9"))
                    || $0 == UInt8(ascii: "_")
            }
    }

    /// Updates and deletes carry the old row as far as the replica identity holds it (checked at start for the
    /// routed columns).
    public nonisolated var givesPreviousValues: Bool { true }

    public func start(after position: String?) async throws {
        if let position {
            guard let parsed = PostgresPosition(position) else {
                throw RelayError(.source, "checkpoint position \(position) is not an LSN (X/Y, or X/Y:index)")
            }
            relayed = parsed
        }
        try await open()
        if configuration.plugin == .pgoutput {
            opened = true
            feed.start(
                after: position, backoff: Backoff(initial: TimeAmount.milliseconds(100), maximum: .seconds(5)),
                connect: { [self] _ in try await stream() },
                ended: { [self] error, _ in await ended(error) })
            return
        }
        // A new peek only once the batches before are acknowledged: a peek decodes the WAL again from the slot's
        // confirmed position, so one made while the previous batch is still being published (the slot not yet
        // advanced) decodes that batch twice (measured with `scripts/bench-relay`: 12,400 changes/s and p50 19.5 ms
        // against 14,200 changes/s and p50 15.3 ms). The rows of one peek are read on while the relay publishes.
        feed.startPolling(
            after: position, backoff: Backoff(initial: TimeAmount.milliseconds(100), maximum: .seconds(5)),
            interval: .nanoseconds(configuration.pollInterval.nanoseconds),
            open: { [self] _ in try await reopen() },
            poll: { [self] in try await poll() },
            ended: { [self] error, _ in await ended(error) })
    }

    /// Connects, creates or checks the slot, and moves it up to what was relayed (a slot rewinds after a server
    /// crash); used at start and after a lost connection.
    func open() async throws {
        let checkpoint = relayed
        stream = nil
        let connection = try await connect()
        self.connection = connection
        let identities = try await replicaIdentities(connection)
        if configuration.plugin == .pgoutput {
            // Before the slot: pgoutput reads a change with the catalog of its commit, so a change committed between
            // a new slot and its publication could never be decoded; and a refused publication leaves no slot behind.
            try await ensurePublication(connection)
            primaryKeys = try await readPrimaryKeys(connection)
        }

        var slot = try await readSlot(connection)
        var lostReason: String?
        if let found = slot, found.lost {
            // Its WAL was removed: the slot can never be read again. Start a new one and resync.
            lostReason = "replication slot \(configuration.slot) was lost (wal_status lost): its WAL was removed"
            try await connection.answer("SELECT pg_drop_replication_slot(\(configuration.slot))", logger: logger)
            slot = nil
        }
        if slot == nil {
            let rows = try await connection.answer(
                "SELECT lsn::text FROM pg_create_logical_replication_slot(\(configuration.slot), \(configuration.plugin.rawValue))",
                logger: logger)
            var created = "?"
            for try await lsn in rows.decode(String.self) { created = lsn }
            logger.notice(
                "created replication slot",
                metadata: [
                    "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.lsn": "\(created)",
                ])
            if let checkpoint, lostReason == nil {
                lostReason =
                    "replication slot \(configuration.slot) was missing although checkpoint \(checkpoint) exists"
            }
            slot = try await readSlot(connection)
        }
        guard let slot else { throw RelayError(.source, "replication slot \(configuration.slot) cannot be read") }
        guard slot.plugin == configuration.plugin.rawValue else {
            throw RelayError(
                .source,
                "replication slot \(configuration.slot) uses the plugin \(slot.plugin), not \(configuration.plugin.rawValue): "
                    + (Plugin(rawValue: slot.plugin).map { "run with --plugin \($0.rawValue), or " } ?? "")
                    + "drop it (SELECT pg_drop_replication_slot('\(configuration.slot)')) and start over with a full resync"
            )
        }
        confirmed = slot.confirmed
        resync = nil
        if let checkpoint {
            if let lostReason {
                startResync(
                    reason: lostReason + "; changes made since are lost", checkpoint: checkpoint, end: slot.confirmed)
            } else if checkpoint.isWholeTransaction, checkpoint.lsn > slot.confirmed {
                // The server crashed after our last confirm and the slot went back: skip what it replays.
                try await advance(connection, to: checkpoint.lsn)
            } else if checkpoint.isWholeTransaction ? checkpoint.lsn < slot.confirmed : checkpoint.lsn <= slot.confirmed
            {
                // Confirmed by someone else, or created anew by a resync that did not finish: the changes between
                // were never relayed. (A checkpoint inside a transaction is never confirmed to the slot: the slot
                // stays before that transaction, which the peek replays and the assembler skips up to the index.)
                startResync(
                    reason:
                        "replication slot \(configuration.slot) is at \(slot.confirmed), ahead of checkpoint \(checkpoint): the changes between were not relayed",
                    checkpoint: checkpoint, end: slot.confirmed)
            }
        } else if let lostReason {
            startResync(reason: lostReason, checkpoint: PostgresPosition(lsn: slot.confirmed), end: slot.confirmed)
        }
        assembler = Wal2JSONAssembler(
            after: max(checkpoint ?? PostgresPosition(lsn: LSN(0)), PostgresPosition(lsn: confirmed)))
        assembler.identityColumns = identities
    }

    private func startResync(reason: String, checkpoint: PostgresPosition, end: LSN) {
        logger.error(
            "full resync of the relayed tables",
            metadata: [
                "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.reason": "\(reason)",
            ])
        resync = Resync(reason: reason, tables: configuration.tables, checkpoint: checkpoint, end: end)
    }

    /// The next page of the resync: rows of the current table ordered by primary key (by physical position when
    /// the table has none).
    func resyncPage(_ connection: PostgresConnection, _ state: Resync) async throws -> ChangeBatch {
        var state = state
        let limit = configuration.maxChangesPerPeek
        var changes: [Change] = []
        while changes.count < limit, let table = state.tables.first {
            let parts = table.split(separator: ".", maxSplits: 1).map(String.init)
            let quoted = parts.map(Self.quoteIdentifier).joined(separator: ".")
            let key: ResyncKey
            if let known = state.key {
                key = known
            } else {
                key = try await primaryKey(connection, table: quoted)
                state.key = key
            }
            let primaryKey = key.names
            let pageSize = limit - changes.count
            let query = key.page(of: quoted, after: state.last, limit: pageSize)
            let logger = logger
            let rows = try await deadline(configuration.queryTimeout, connection) {
                let result = try await connection.answer(query, logger: logger)
                var rows: [(text: String, key: [String])] = []
                for try await row in result {
                    let cells = row.makeRandomAccess()
                    rows.append(
                        (
                            try cells[0].decode(String.self),
                            try (1..<cells.count).map { try cells[$0].decode(String.self) }
                        ))
                }
                return rows
            }
            for (text, _) in rows {
                guard let object = try? JSONParser().parse(Array(text.utf8)).objectValue else {
                    throw RelayError(.source, "the server returned a row of \(table) that is not a JSON object")
                }
                let row = Wal2JSONRecord.RowChange(
                    operation: .update, schema: parts[0], table: parts[1],
                    columns: object.entries.map { Wal2JSONRecord.Column(name: $0.key, value: $0.value) },
                    identity: [], primaryKey: primaryKey)
                // A resync tells each row's audience of today only (`previous` is the row itself): whoever lost a
                // row during the gap learns it from its own full sync.
                changes.append(
                    Change(
                        collection: parts, id: row.id, operation: .update, seq: state.end.description + ":resync",
                        document: row.document, extra: ["resync": .bool(true)], previous: row.document))
            }
            if rows.count < pageSize {
                state.tables.removeFirst()
                state.key = nil
                state.last = nil
            } else {
                state.last = rows.last?.key
            }
        }
        let notice: PubSubRelay.Resync? = state.announced ? nil : PubSubRelay.Resync(reason: state.reason)
        state.announced = true
        if state.tables.isEmpty {
            resync = nil
            logger.notice(
                "full resync read every row; following the slot again",
                metadata: [
                    "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.lsn": "\(state.end)",
                ])
            return ChangeBatch(changes: changes, position: state.end.description, resync: notice)
        }
        resync = state
        return ChangeBatch(changes: changes, position: state.checkpoint.description, resync: notice)
    }

    func primaryKey(_ connection: PostgresConnection, table quoted: String) async throws -> ResyncKey {
        let rows = try await connection.answer(
            """
            SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_index i \
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
            WHERE i.indrelid = \(quoted)::regclass AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)
            """, logger: logger)
        var key = ResyncKey(names: [], types: [])
        for try await (name, type) in rows.decode((String, String).self) {
            key.names.append(name)
            key.types.append(type)
        }
        return key
    }

    static func quoteIdentifier(_ name: String) -> String {
        "\"" + name.split(separator: "\"", omittingEmptySubsequences: false).joined(separator: "\"\"") + "\""
    }

    /// The next batch the reader handed over, waiting for it; nil once the source is closed.
    public func next() async throws -> ChangeBatch? {
        try await feed.next()
    }

    /// The connection was lost (`ended` reconnects after the backoff's pause).
    struct ConnectionLost: Error {
        var error: any Error
    }

    /// A new connection could not be opened (`ended` tries again after the backoff's pause).
    struct CannotReconnect: Error {
        var error: any Error
    }

    /// The reader's `open`: connects again after a lost connection (the first connection is `start`'s).
    /// `anew`: even when the SQL connection is still open (the stream's connection is the one that was lost).
    func reopen(anew: Bool = false) async throws {
        if let connection, !connection.isClosed {
            guard anew else { return }
            self.connection = nil
            try? await connection.close()
        }
        do {
            try await open()
        } catch {
            if let connection, !connection.isClosed { try? await connection.close() }
            connection = nil
            throw CannotReconnect(error: error)
        }
        logger.notice("reconnected to PostgreSQL", metadata: ["pubsub.relay.slot": "\(configuration.slot)"])
    }

    /// The reader's `poll`: advances the slot to what the relay confirmed, then hands over a page of the resync, or
    /// the batches of one peek as they are read.
    private func poll() async throws -> PushFeed.Poll {
        guard let connection, !connection.isClosed else {
            // The server closed it (restart, crash, terminated backend); a query on it would wait forever.
            self.connection = nil
            throw ConnectionLost(error: RelayError(.source, "connection closed by the server"))
        }
        do {
            if let resync {
                try await feed.hand(try await resyncPage(connection, resync))
                return .full
            }
            // Only past whole transactions: a slot advanced into one would never give its other changes again.
            if let relayed, relayed.isWholeTransaction, relayed.lsn > confirmed {
                try await advance(connection, to: relayed.lsn)
            }
            if wantsHead {
                wantsHead = false
                try await readHead(connection)
            }
            repeat {
                try await feed.hand(try await read(connection))
            } while stream != nil
            return peekRows >= configuration.maxChangesPerPeek ? .full : .drained
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            stream = nil
            guard connection.isClosed || Self.endsTheConnection(error) else { throw error }
            if !connection.isClosed { try? await connection.close() }
            // The checkpoint is durable: the slot is advanced to it once connected again.
            self.connection = nil
            throw ConnectionLost(error: error)
        }
    }

    /// What follows the end of a connection: a new one after the backoff's pause when it was lost or could not be
    /// opened; else the relay stops on the error (and is restarted).
    func ended(_ error: (any Error)?) -> PushFeed.Next {
        switch error {
        case let lost as ConnectionLost:
            metrics.reconnects.increment()
            logger.warning(
                "lost the connection to PostgreSQL; reconnecting",
                metadata: [
                    "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.error": "\(Self.describe(lost.error))",
                ])
            return .pause(reset: true)
        case let failed as CannotReconnect:
            logger.warning(
                "cannot reconnect to PostgreSQL",
                metadata: [
                    "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.error": "\(failed.error)",
                ])
            return .pause(reset: false)
        case let error?:
            return .stop(error)
        case nil:
            return .pause(reset: false)
        }
    }

    /// The next batch of the slot's changes: at most `maxChangesPerPeek`, read from the open peek, or from a new
    /// one when the last was read to its end; nil when the position did not move. The batch ends at a commit, or
    /// inside a transaction when it is full: its position then points inside it.
    private func read(_ connection: PostgresConnection) async throws -> ChangeBatch? {
        let limit = configuration.maxChangesPerPeek
        let before = assembler.after
        var changes: [Change] = []
        changes.reserveCapacity(min(limit, 1024))
        do {
            let starting = stream == nil
            if starting { peekRows = 0 }
            var rows = stream
            var ended = false
            let timeout = starting ? peekTimeout : configuration.queryTimeout
            do {
                try await Deadline.run(timeout, on: connection.eventLoop, expire: { Self.closeNow(connection) }) {
                    if rows == nil { rows = try await self.startPeek(connection).makeAsyncIterator() }
                    while changes.count < limit {
                        guard let row = try await rows?.next(isolation: #isolation) else {
                            ended = true
                            return
                        }
                        peekRows += 1
                        let (lsnText, data) = try row.decode((String, String).self)
                        guard let lsn = LSN(lsnText) else {
                            throw RelayError(.source, "the server returned a bad LSN \(lsnText)")
                        }
                        if case .change(let change)? = try assembler.feed(lsn: lsn, data: data) {
                            changes.append(change)
                        }
                    }
                }
            } catch is Deadline.Expired {
                stream = nil
                if starting {
                    peekTimeout = min(peekTimeout * 2, .minutes(30))
                    logger.warning(
                        "no rows from the slot in time (a large transaction?): the next peek waits longer",
                        metadata: [
                            "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.timeout": "\(peekTimeout)",
                        ])
                }
                throw Self.noAnswer(timeout)
            } catch {
                stream = nil
                throw error
            }
            if starting { peekTimeout = configuration.queryTimeout }
            stream = ended ? nil : rows
        }
        guard assembler.after > before else { return nil }
        return ChangeBatch(changes: changes, position: assembler.after.description)
    }

    private func startPeek(_ connection: PostgresConnection) async throws -> PostgresRowSequence {
        let slot = configuration.slot
        let limit = Int32(clamping: configuration.maxChangesPerPeek)
        let tables = configuration.tables.joined(separator: ",")
        return try await connection.answer(
            """
            SELECT lsn::text, data FROM pg_logical_slot_peek_changes(\(slot), NULL, \(limit), \
            'format-version', '2', 'include-pk', '1', 'include-xids', '1', 'include-lsn', '1', \
            'include-transaction', '1', 'include-timestamp', '1', 'add-tables', \(tables))
            """,
            logger: logger)
    }

    /// Records that everything up to `position` is relayed; the reader advances the slot to it before its next
    /// peek.
    public func confirm(_ position: String) async throws {
        guard let parsed = PostgresPosition(position) else { throw RelayError(.source, "bad position \(position)") }
        relayed = max(relayed ?? parsed, parsed)
        if configuration.plugin == .pgoutput, parsed.isWholeTransaction { confirmStream(parsed.lsn) }
        feed.acknowledge()
    }

    /// Whether the slot's lag, as streaming last reported it, is above `behindBytes` (it is said so again once it
    /// is at most half of that). Polling never says it is behind.
    public func isBehind() async -> Bool { behind }

    /// How far the last batch read is behind the server's WAL head. The head is read by the reader before its next
    /// peek (the connection is its own); this reports the head it read last.
    public func lag() async -> SourceLag? {
        if configuration.plugin == .pgoutput { return streamLag() }
        wantsHead = true
        guard let head else { return nil }
        let read = max(assembler.lastRead ?? assembler.after.lsn, assembler.after.lsn)
        return SourceLag(amount: head.value &- min(head.value, read.value), unit: "WAL bytes")
    }

    func readHead(_ connection: PostgresConnection) async throws {
        let logger = logger
        let text = try await deadline(configuration.queryTimeout, connection) { () async throws -> String? in
            let rows = try await connection.answer("SELECT pg_current_wal_lsn()::text", logger: logger)
            for try await text in rows.decode(String.self) { return text }
            return nil
        }
        if let text, let lsn = LSN(text) { head = lsn }
    }

    /// Stops the reader (ending its connection first, so that a query in flight does not hold it) and closes.
    public func close() async {
        feed.cancel()
        if let replication {
            self.replication = nil
            try? await replication.close()
        }
        if let connection {
            self.connection = nil
            try? await connection.close()
        }
        await feed.close()
        if let connection {
            self.connection = nil
            try? await connection.close()
        }
    }

    // MARK: -

    func connect() async throws -> PostgresConnection {
        var configuration: PostgresConnection.Configuration
        do {
            configuration = try self.configuration.dsn.configuration()
        } catch {
            throw RelayError(.source, "cannot set up TLS to PostgreSQL at \(self.configuration.dsn.endpoint): \(error)")
        }
        configuration.options.connectTimeout = self.configuration.connectTimeout
        do {
            // postgres-nio sends a SCRAM password as given: hand it the SASLprep'd one, as PostgreSQL prepared it
            // for the verifier. A server that refuses it may hold an MD5 hash of the raw password instead.
            if let password = configuration.password, case let prepared = SASLprep.prepare(password),
                !prepared.utf8.elementsEqual(password.utf8)  // bytes: String equality is canonical
            {
                configuration.password = prepared
                do {
                    return try await PostgresConnection.connect(
                        on: eventLoopGroup.next(), configuration: configuration, id: 1, logger: logger
                    ).get()
                } catch let error as PSQLError where error.serverInfo?[.sqlState] == "28P01" {
                    configuration.password = password
                }
            }
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
        let rows = try await connection.answer(
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
        try await deadline(configuration.queryTimeout, connection) {
            try await connection.answer(
                "SELECT pg_replication_slot_advance(\(slot), \(lsn.description)::pg_lsn)", logger: logger)
            return ()
        }
        confirmed = lsn
    }

    /// Runs a query (or reads rows), giving up after `timeout`: the connection is then closed (a dead peer that
    /// sent nothing is noticed) and the caller treats it as lost. The timer is cancelled as soon as it answers.
    func deadline<T>(
        _ timeout: TimeAmount, _ connection: PostgresConnection, _ body: () async throws -> T
    ) async throws -> T {
        do {
            return try await Deadline.run(
                timeout, on: connection.eventLoop, expire: { Self.closeNow(connection) }, body)
        } catch is Deadline.Expired {
            throw Self.noAnswer(timeout)
        }
    }

    /// Closes `connection` without waiting: whatever waits on it then fails.
    static func closeNow(_ connection: PostgresConnection) {
        let closing: EventLoopFuture<Void> = connection.close()
        closing.whenComplete { _ in }
    }

    private static func noAnswer(_ timeout: TimeAmount) -> RelayError {
        RelayError(.source, "no answer from PostgreSQL within \(timeout.nanoseconds / 1_000_000_000) s")
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
        if error.code == .authMechanismRequiresPassword {
            return "PostgreSQL asks for a password, and the --dsn gives none"
        }
        if let message = error.serverInfo?[.message] { return message }
        if let underlying = error.underlying { return "\(underlying)" }
        return "\(error.code)"
    }
}

extension PostgresChangeSource {
    public nonisolated func describe(_ error: any Error) -> String { Self.describe(error) }
}

/// The key a full resync pages a table by: its primary key's columns and their SQL types, or, for a table without
/// one, the row's physical position (`ctid`; a row updated during the resync may then move behind it and be missed,
/// which only a primary key prevents).
struct ResyncKey: Sendable, Equatable {
    var names: [String]
    var types: [String]

    /// The page after the row whose key was `last` (as text, cast back to the key's types): the rows as JSON, then
    /// each key column as text. Every value is a bound parameter; names are quoted.
    func page(of table: String, after last: [String]?, limit: Int) -> PostgresQuery {
        let (sql, values) = pageSQL(of: table, after: last, limit: limit)
        var binds = PostgresBindings()
        for value in values { binds.append(value) }
        return PostgresQuery(unsafeSQL: sql, binds: binds)
    }

    func pageSQL(of table: String, after last: [String]?, limit: Int) -> (sql: String, binds: [String]) {
        let columns = names.isEmpty ? ["t.ctid"] : names.map { "t." + PostgresChangeSource.quoteIdentifier($0) }
        let types = names.isEmpty ? ["tid"] : types
        // `t.*`, not `t`: in `row_to_json(t)` a column named `t` would be taken instead of the row.
        var sql = "SELECT row_to_json(t.*)::text"
        for column in columns { sql += ", \(column)::text" }
        sql += " FROM ONLY \(table) t"
        var binds: [String] = []
        if let last, last.count == columns.count {
            let values = zip(types.indices, types).map { "CAST($\($0 + 1) AS \($1))" }
            sql += " WHERE (\(columns.joined(separator: ", "))) > (\(values.joined(separator: ", ")))"
            binds = last
        }
        sql += " ORDER BY \(columns.joined(separator: ", ")) LIMIT \(limit)"
        return (sql, binds)
    }
}
