import CoreMetrics
import Logging
import NIOCore
import PostgresNIO

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The pgoutput stream: one replication connection at a time, opened by the shared reader (`PushFeed.start`),
/// which reconnects after its backoff's pause when the connection is lost.
extension PostgresChangeSource {
    /// The name of the publication pgoutput reads.
    var publicationName: String { configuration.publication ?? "pubsub_" + configuration.slot }

    /// One connection: open (check the slot, the publication, a resync) unless `start` just did, the resync's
    /// pages if one is due, then the stream from where the relay is.
    func stream() async throws {
        if opened {
            opened = false
        } else {
            // Resume after everything handed over: the relay's confirmations tell where that is.
            try await feed.settled()
            try await reopen(anew: true)
        }
        guard let connection, !connection.isClosed else {
            throw ConnectionLost(error: RelayError(.source, "connection closed by the server"))
        }
        do {
            while let resync { try await feed.hand(try await resyncPage(connection, resync)) }
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            guard connection.isClosed || Self.endsTheConnection(error) else { throw error }
            throw ConnectionLost(error: error)
        }
        let after = max(relayed ?? PostgresPosition(lsn: LSN(0)), PostgresPosition(lsn: confirmed))
        var assembler = PgOutputAssembler(after: after, limit: configuration.maxChangesPerPeek)
        assembler.identityColumns = self.assembler.identityColumns
        assembler.primaryKeys = primaryKeys
        streamAssembler = assembler
        // Inside a transaction the stream must give that transaction again: from the slot's own position, which
        // is never inside one.
        let start = after.isWholeTransaction ? after.lsn : LSN(0)
        let channel: ReplicationChannel.Channel
        do {
            channel = try await ReplicationChannel.connect(
                dsn: configuration.dsn, timeout: configuration.connectTimeout,
                on: connection.eventLoop, maxMessageSize: configuration.maxMessageSize)
        } catch {
            throw ConnectionLost(
                error: RelayError(
                    .source,
                    "cannot open a replication connection to \(configuration.dsn.endpoint): \(FeedTLS.describe(error))")
            )
        }
        try await channel.executeThenClose { inbound, _ in
            try await self.read(inbound, channel: channel.channel, start: start)
        }
    }

    /// Reads the stream until it ends: every socket read's messages through the machine, a batch handed over as
    /// soon as one is full, and whatever is ready once everything read so far was taken in.
    private func read(
        _ inbound: NIOAsyncChannelInboundStream<[PostgresBackendMessage]>, channel: any NIOCore.Channel, start: LSN
    ) async throws {
        let dsn = configuration.dsn
        machine = ReplicationStateMachine(
            settings: .init(
                user: dsn.user, database: dsn.database, password: dsn.password, slot: configuration.slot,
                publication: publicationName, start: start))
        replication = channel
        streamFailure = nil
        // Startup and authentication within the connect and query timeouts together.
        let startup = channel.eventLoop.scheduleTask(in: configuration.connectTimeout + configuration.queryTimeout) {
            channel.close(promise: nil)
        }
        let ticker = Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(1))
                await self?.tick()
            }
        }
        defer {
            startup.cancel()
            ticker.cancel()
            machine = nil
            replication = nil
        }
        try perform(machine!.start(), channel)
        do {
            for try await burst in inbound {
                for message in burst {
                    if machine?.isStreaming == false, case .copyBothResponse = message { startup.cancel() }
                    guard var current = machine else { break }
                    let actions = current.received(message, now: .now())
                    machine = current
                    try perform(actions, channel)
                    while let batch = streamAssembler.batch(flush: false) { try await hand(batch) }
                }
                if let batch = streamAssembler.batch(flush: true) { try await hand(batch) }
                metrics.held.record(streamAssembler.heldChanges)
            }
        } catch let stop as StreamStop {
            throw stop.error
        } catch  where streamFailure != nil {
            throw streamFailure!
        } catch is CancellationError {
            throw CancellationError()
        } catch let lost as ConnectionLost {
            throw lost
        } catch {
            throw ConnectionLost(error: error)
        }
        if let streamFailure { throw streamFailure }
        throw ConnectionLost(
            error: RelayError(
                .source,
                machine?.isStreaming == true
                    ? "the replication connection was closed by the server"
                    : "the replication connection closed before the stream started"))
    }

    /// Hands `batch` to the relay; while it waits, the server's silence does not count.
    private func hand(_ batch: ChangeBatch) async throws {
        machine?.waiting()
        defer { machine?.reading(now: .now()) }
        try await feed.hand(batch)
    }

    /// An error that ends the feed (the relay stops on it) rather than the connection.
    struct StreamStop: Error {
        var error: RelayError
    }

    private func perform(_ actions: [ReplicationStateMachine.Action], _ channel: any NIOCore.Channel) throws {
        for action in actions {
            switch action {
            case .send(let message):
                channel.writeAndFlush(message, promise: nil)
            case .sendStatus(let status):
                channel.writeAndFlush(
                    PostgresFrontendMessage.copyData(status.bytes(clock: Self.clock())), promise: nil)
            case .streaming:
                logger.info(
                    "streaming the slot",
                    metadata: [
                        "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.publication": "\(publicationName)",
                        "pubsub.relay.lsn": "\(streamAssembler.after)",
                    ])
            case .xlogData(let start, var payload):
                do {
                    try streamAssembler.feed(try PgOutputMessage.decode(&payload), at: start)
                } catch {
                    throw StreamStop(error: error)
                }
            case .keepalive(let position):
                let now = NIODeadline.now()
                lastKeepalive = now
                if head.map({ $0 < position }) ?? true { head = position }
                // At most once a second: each moved position is a checkpoint written and a status sent.
                if now - lastProgress >= .seconds(1), streamAssembler.progress(to: position) { lastProgress = now }
            case .notice(let text):
                logger.debug("PostgreSQL: \(text)", metadata: ["pubsub.relay.slot": "\(configuration.slot)"])
            case .fail(let failure):
                throw Self.classify(failure)
            }
        }
    }

    /// A refused login or a name the server does not know stops the feed (retrying cannot help); anything else
    /// is a lost connection, opened again after the backoff's pause (a server restarting, a walsender terminated,
    /// a slot still held by the walsender of a relay that was killed, an invalidated slot found by the next open).
    static func classify(_ failure: ReplicationStateMachine.Failure) -> any Error {
        switch failure {
        case .server(let error):
            let state = error.sqlState
            let text = "PostgreSQL refused the replication stream: \(error.message)"
            if state.hasPrefix("28") || state.hasPrefix("42") { return StreamStop(error: RelayError(.source, text)) }
            return ConnectionLost(error: RelayError(.source, text))
        case .authentication(let text):
            return StreamStop(error: RelayError(.source, text))
        case .protocolViolation:
            return StreamStop(error: RelayError(.source, failure.description))
        case .streamEnded, .silent:
            return ConnectionLost(error: RelayError(.source, failure.description))
        }
    }

    /// Performs actions outside the reader (a confirmation, a tick): a failure closes the channel, and the reader,
    /// which sees the stream end, throws it.
    private func performBeside(_ actions: [ReplicationStateMachine.Action], _ channel: any NIOCore.Channel) {
        do {
            try perform(actions, channel)
        } catch {
            streamFailure = (error as? StreamStop)?.error ?? error
            channel.close(promise: nil)
        }
    }

    /// The relay confirmed a whole transaction: the next status reports it.
    func confirmStream(_ lsn: LSN) {
        if lsn > confirmed { confirmed = lsn }
        metrics.confirmed.record(Double(lsn.value))
        guard let channel = replication, var current = machine else { return }
        let actions = current.confirmed(lsn, now: .now())
        machine = current
        performBeside(actions, channel)
    }

    /// Once a second while streaming: a status when one is due, the metrics, and every 5 s the server's WAL head.
    func tick() async {
        guard let channel = replication, var current = machine else { return }
        let now = NIODeadline.now()
        let actions = current.tick(now: now)
        machine = current
        performBeside(actions, channel)
        if let lastKeepalive {
            metrics.keepaliveAge.record(Double((now - lastKeepalive).nanoseconds) / 1e9)
        }
        guard !readingHead, now - lastHeadRead >= .seconds(5), let connection, !connection.isClosed else { return }
        readingHead = true
        lastHeadRead = now
        defer { readingHead = false }
        try? await readHead(connection)
        reportLag()
    }

    /// The slot's lag: the server's WAL head less what the relay confirmed; said in the log when it crosses
    /// `behindBytes`, either way.
    private func reportLag() {
        guard let head else { return }
        let lag = head.value &- min(head.value, confirmed.value)
        metrics.lag.record(Double(lag))
        let metadata: Logger.Metadata = [
            "pubsub.relay.slot": "\(configuration.slot)", "pubsub.relay.lag_bytes": "\(lag)",
            "pubsub.relay.confirmed": "\(confirmed)", "pubsub.relay.head": "\(head)",
        ]
        if lag > configuration.behindBytes, !behind {
            behind = true
            logger.warning("behind: the slot is more WAL behind the server than the limit", metadata: metadata)
        } else if lag <= configuration.behindBytes / 2, behind {
            behind = false
            logger.notice("caught up with the server", metadata: metadata)
        }
    }

    func streamLag() -> SourceLag? {
        guard let head else { return nil }
        let read = max(streamAssembler.lastRead ?? confirmed, confirmed)
        return SourceLag(amount: head.value &- min(head.value, read.value), unit: "WAL bytes")
    }

    /// Makes sure the publication exists and holds the relayed tables: the default one is created (or given the
    /// missing tables); a named one must already hold them.
    func ensurePublication(_ connection: PostgresConnection) async throws {
        let name = publicationName
        let rows = try await connection.answer(
            """
            SELECT p.pubname::text, coalesce(t.schemaname || '.' || t.tablename, '') FROM pg_publication p \
            LEFT JOIN pg_publication_tables t ON t.pubname = p.pubname WHERE p.pubname = \(name)
            """, logger: logger)
        var exists = false
        var held: Set<String> = []
        for try await (_, table) in rows.decode((String, String).self) {
            exists = true
            if !table.isEmpty { held.insert(table) }
        }
        let missing = configuration.tables.filter { !held.contains($0) }
        if configuration.publication != nil {
            guard exists else { throw RelayError(.source, "publication \(name) does not exist") }
            guard missing.isEmpty else {
                throw RelayError(
                    .source, "publication \(name) does not include \(missing.joined(separator: ", "))")
            }
            return
        }
        guard !missing.isEmpty else { return }
        let tables = missing.map(ReplicaIdentity.sqlName).joined(separator: ", ")
        let verb =
            exists
            ? "ALTER PUBLICATION \(Self.quoteIdentifier(name)) ADD TABLE"
            : "CREATE PUBLICATION \(Self.quoteIdentifier(name)) FOR TABLE"
        try await connection.answer(PostgresQuery(unsafeSQL: "\(verb) \(tables)"), logger: logger)
        logger.notice(
            exists ? "added tables to the publication" : "created the publication",
            metadata: ["pubsub.relay.publication": "\(name)", "pubsub.relay.tables": "\(missing)"])
    }

    /// Each relayed table's primary key (empty for a table without one).
    func readPrimaryKeys(_ connection: PostgresConnection) async throws -> [String: [String]] {
        var keys: [String: [String]] = [:]
        for table in configuration.tables {
            let quoted = table.split(separator: ".", maxSplits: 1).map { Self.quoteIdentifier(String($0)) }
                .joined(separator: ".")
            keys[table] = try await primaryKey(connection, table: quoted).names
        }
        return keys
    }

    /// Microseconds since 2000-01-01, the clock of a standby status.
    static func clock() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return (Int64(now.tv_sec) - 946_684_800) * 1_000_000 + Int64(now.tv_nsec) / 1000
    }
}

/// What an operator reads of a PostgreSQL source (with `pubsub serve --relay`, at /metrics).
struct PostgresSourceMetrics: Sendable {
    /// The server's WAL head less the confirmed position, in bytes.
    let lag: Gauge
    /// The last position confirmed to the slot, as a number.
    let confirmed: Gauge
    /// Seconds since the server's last keepalive.
    let keepaliveAge: Gauge
    /// Changes read and not yet handed to the relay.
    let held: Gauge
    let reconnects: Counter

    init(source: String) {
        let dimensions = [("source", source)]
        lag = Gauge(label: "pubsub_relay_slot_lag_bytes", dimensions: dimensions)
        confirmed = Gauge(label: "pubsub_relay_confirmed_lsn", dimensions: dimensions)
        keepaliveAge = Gauge(label: "pubsub_relay_keepalive_age_seconds", dimensions: dimensions)
        held = Gauge(label: "pubsub_relay_held_changes", dimensions: dimensions)
        reconnects = Counter(label: "pubsub_relay_reconnects_total", dimensions: dimensions)
    }
}
