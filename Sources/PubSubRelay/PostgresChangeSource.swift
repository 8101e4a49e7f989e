import Logging
import NIOCore
import NIOPosix
import PostgresNIO

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

        public init(dsn: PostgresDSN, slot: String, tables: [String], maxChangesPerPeek: Int = 5000,
                    connectTimeout: TimeAmount = .seconds(5)) {
            self.dsn = dsn
            self.slot = slot
            self.tables = tables
            self.maxChangesPerPeek = maxChangesPerPeek
            self.connectTimeout = connectTimeout
        }
    }

    public struct SourceError: Error, Sendable, CustomStringConvertible {
        public var message: String
        public init(_ message: String) { self.message = message }
        public var description: String { message }
    }

    public nonisolated let sourceID: String
    public let configuration: Configuration
    private let logger: Logger
    private let eventLoopGroup: any EventLoopGroup
    private var connection: PostgresConnection?
    private var assembler = Wal2JSONAssembler(after: LSN(0))
    /// The slot's position as far as this source confirmed it.
    private var confirmed = LSN(0)

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

    public func start(after position: String?) async throws {
        var checkpoint: LSN?
        if let position {
            guard let lsn = LSN(position) else { throw SourceError("checkpoint position \(position) is not an LSN") }
            checkpoint = lsn
        }
        let connection = try await connect()
        self.connection = connection

        var slot = try await readSlot(connection)
        if slot == nil {
            let rows = try await connection.query(
                "SELECT lsn::text FROM pg_create_logical_replication_slot(\(configuration.slot), 'wal2json')",
                logger: logger)
            var created = "?"
            for try await lsn in rows.decode(String.self) { created = lsn }
            logger.notice("created replication slot", metadata: [
                "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.lsn": "\(created)"])
            if let checkpoint {
                logger.error(
                    "replication slot was missing although a checkpoint exists: changes made while it was gone are lost; resync the subscribers",
                    metadata: ["pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.checkpoint": "\(checkpoint)"])
            }
            slot = try await readSlot(connection)
        }
        guard let slot else { throw SourceError("replication slot \(configuration.slot) cannot be read") }
        guard slot.plugin == "wal2json" else {
            throw SourceError("replication slot \(configuration.slot) uses the plugin \(slot.plugin), not wal2json")
        }
        if slot.lost {
            logger.error("replication slot is lost (its WAL was removed): changes are missing; resync the subscribers",
                         metadata: ["pubsub.relay.slot": "\(configuration.slot)"])
            throw SourceError("replication slot \(configuration.slot) is lost (wal_status lost): drop it and resync")
        }
        confirmed = slot.confirmed
        if let checkpoint {
            if checkpoint > slot.confirmed {
                // The server crashed after our last confirm and the slot went back: skip what it replays.
                try await advance(connection, to: checkpoint)
            } else if checkpoint < slot.confirmed {
                logger.error(
                    "replication slot is ahead of the checkpoint: changes between were confirmed by someone else and are not relayed; resync the subscribers",
                    metadata: ["pubsub.relay.slot": "\(configuration.slot)",
                               "pubsub.relay.checkpoint": "\(checkpoint)", "pubsub.relay.slot_lsn": "\(slot.confirmed)"])
            }
        }
        assembler = Wal2JSONAssembler(after: max(checkpoint ?? LSN(0), confirmed))
    }

    public func next() async throws -> ChangeBatch? {
        guard let connection else { throw SourceError("not started") }
        let rows = try await connection.query(
            """
            SELECT lsn::text, data FROM pg_logical_slot_peek_changes(\(configuration.slot), NULL, \
            \(Int32(clamping: configuration.maxChangesPerPeek)), 'format-version', '2', 'include-pk', '1', 'include-xids', '1', \
            'include-lsn', '1', 'include-transaction', '1', 'include-timestamp', '1', 'add-tables', \
            \(configuration.tables.joined(separator: ",")))
            """,
            logger: logger)
        var changes: [Change] = []
        var position: String?
        for try await (lsnText, data) in rows.decode((String, String).self) {
            guard let lsn = LSN(lsnText) else { throw SourceError("the server returned a bad LSN \(lsnText)") }
            if let batch = try assembler.feed(lsn: lsn, data: data) {
                changes += batch.changes
                position = batch.position
            }
        }
        guard let position else { return nil }
        return ChangeBatch(changes: changes, position: position)
    }

    public func confirm(_ position: String) async throws {
        guard let connection else { throw SourceError("not started") }
        guard let lsn = LSN(position) else { throw SourceError("bad position \(position)") }
        guard lsn > confirmed else { return }
        try await advance(connection, to: lsn)
    }

    public func lag() async -> SourceLag? {
        guard let connection else { return nil }
        do {
            let rows = try await connection.query("SELECT pg_current_wal_lsn()::text", logger: logger)
            for try await text in rows.decode(String.self) {
                guard let head = LSN(text) else { return nil }
                return SourceLag(amount: head.value &- min(head.value, assembler.after.value), unit: "WAL bytes")
            }
        } catch {
            return nil
        }
        return nil
    }

    public func close() async {
        if let connection {
            self.connection = nil
            try? await connection.close()
        }
    }

    // MARK: -

    private func connect() async throws -> PostgresConnection {
        var configuration = configuration.dsn.configuration
        configuration.options.connectTimeout = self.configuration.connectTimeout
        do {
            return try await PostgresConnection.connect(
                on: eventLoopGroup.next(), configuration: configuration, id: 1, logger: logger
            ).get()
        } catch let error as PSQLError {
            throw SourceError("cannot connect to PostgreSQL at \(self.configuration.dsn.endpoint): \(Self.describe(error))")
        } catch {
            throw SourceError("cannot connect to PostgreSQL at \(self.configuration.dsn.endpoint): \(error)")
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
        try await connection.query(
            "SELECT pg_replication_slot_advance(\(configuration.slot), \(lsn.description)::pg_lsn)", logger: logger)
        confirmed = lsn
    }

    /// The server's message of a PostgreSQL error, else the error's code.
    public static func describe(_ error: PSQLError) -> String {
        if let message = error.serverInfo?[.message] { return message }
        if let underlying = error.underlying { return "\(underlying)" }
        return "\(error.code)"
    }
}
