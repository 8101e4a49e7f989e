import PostgresNIO

extension PostgresChangeSource {
    /// One table's replica identity, as `pg_class.relreplident` and its index say.
    struct ReplicaIdentity: Sendable, Equatable {
        /// `d` (default: the primary key), `f` (full), `i` (an index), `n` (nothing).
        var kind: String
        /// Every column of the table.
        var columns: [String]
        /// The identity's columns (empty for `n`, every column for `f`).
        var identity: [String]

        /// What the identity is, for people: `the primary key (id)`.
        var described: String {
            switch kind {
            case "f": "FULL"
            case "i": "the index (\(identity.joined(separator: ", ")))"
            case "n": "NOTHING"
            default:
                identity.isEmpty
                    ? "DEFAULT, and the table has no primary key"
                    : "the primary key (\(identity.joined(separator: ", ")))"
            }
        }

        /// Why routes reading `routed` cannot name a row's old audience on `table`, or nil when they can.
        func problem(table: String, routed: Set<String>) -> String? {
            let unknown = routed.filter { !columns.contains($0) }.sorted()
            if !unknown.isEmpty {
                return "\(table) has no column \(unknown.joined(separator: ", ")) (its routes read it)"
            }
            guard kind != "f" else { return nil }
            let missing = routed.filter { !identity.contains($0) }.sorted()
            guard !missing.isEmpty else { return nil }
            return "\(table): its routes read \(missing.joined(separator: ", ")), which its replica identity, "
                + "\(described), does not hold, so a delete or a moving update could not tell its old audience; "
                + "run: ALTER TABLE \(Self.sqlName(table)) REPLICA IDENTITY FULL"
        }

        /// `schema.table` as SQL names it: each part as it is when it is a plain lower-case identifier, quoted
        /// otherwise (`public."Odd Table"`).
        static func sqlName(_ table: String) -> String {
            table.split(separator: ".", maxSplits: 1).map { part in
                let plain =
                    part.first.map { $0 == "_" || ("a"..."z").contains($0) } == true
                    && part.allSatisfy {
                        $0 == "_" || $0 == "$" || ("a"..."z").contains($0) || ("0"..."9").contains($0)
                    }
                return plain ? String(part) : PostgresChangeSource.quoteIdentifier(String(part))
            }.joined(separator: ".")
        }
    }

    /// Every relayed table's replica identity columns (nil for FULL), after checking that each routed table's
    /// identity holds the columns its routes read: else a `configuration` error naming the table, the columns
    /// and the SQL that fixes it.
    func replicaIdentities(_ connection: PostgresConnection) async throws -> [String: [String]?] {
        var result: [String: [String]?] = [:]
        for table in configuration.tables {
            let quoted = table.split(separator: ".", maxSplits: 1).map { Self.quoteIdentifier(String($0)) }
                .joined(separator: ".")
            let found = try await connection.answer(
                PostgresQuery(
                    unsafeSQL: """
                        SELECT c.relreplident::text, \
                        ARRAY(SELECT a.attname::text FROM pg_attribute a \
                              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum), \
                        ARRAY(SELECT a.attname::text FROM pg_index i \
                              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                              WHERE i.indrelid = c.oid AND ((c.relreplident = 'd' AND i.indisprimary) \
                                    OR (c.relreplident = 'i' AND i.indisreplident))) \
                        FROM pg_class c WHERE c.oid = to_regclass('\(quoted.split(separator: "'", omittingEmptySubsequences: false).joined(separator: "''"))')
                        """),
                logger: logger)
            var identity: ReplicaIdentity?
            for try await (kind, columns, key) in found.decode((String, [String], [String]).self) {
                identity = ReplicaIdentity(kind: kind, columns: columns, identity: kind == "f" ? columns : key)
            }
            guard let identity else {
                if configuration.routedColumns[table] != nil {
                    throw RelayError(.configuration, "\(table) does not exist, and routes are given for it")
                }
                continue
            }
            if let routed = configuration.routedColumns[table],
                let problem = identity.problem(table: table, routed: routed)
            {
                throw RelayError(.configuration, problem)
            }
            if configuration.plugin == .pgoutput, configuration.publication == nil, identity.identity.isEmpty {
                // PostgreSQL refuses UPDATE and DELETE on a table published without one: the app would break.
                throw RelayError(
                    .configuration,
                    "\(table) has no replica identity (\(identity.described)): once in the publication, PostgreSQL "
                        + "would refuse its UPDATE and DELETE; add a primary key, or run: ALTER TABLE "
                        + "\(ReplicaIdentity.sqlName(table)) REPLICA IDENTITY FULL")
            }
            result[table] = identity.kind == "f" ? .some(nil) : .some(identity.identity)
        }
        return result
    }
}
