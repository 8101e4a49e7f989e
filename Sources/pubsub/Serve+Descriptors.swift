import Logging
import PubSubServer

extension Serve {
    /// Raises the soft descriptor limit to the hard one (logging both figures), then returns the
    /// `--max-connections` in force: the one given, or one derived from the limit
    /// (`DescriptorLimit.defaultMaxConnections`), logged either way.
    func descriptorBudget(logger: Logger) throws -> Int {
        let raise = DescriptorLimit.raiseSoftToHard()
        let limit = raise.after ?? raise.before
        if let failure = raise.failure {
            logger.warning(
                "file descriptor limit: could not raise the soft limit to the hard limit (\(failure)); serving with \(describe(limit?.soft)) (hard \(describe(limit?.hard)))"
            )
        } else if let before = raise.before, let after = raise.after, raise.raised {
            logger.info(
                "file descriptor limit: soft \(describe(after.soft)) (raised from \(describe(before.soft))), hard \(describe(after.hard))"
            )
        } else {
            logger.info("file descriptor limit: soft \(describe(limit?.soft)), hard \(describe(limit?.hard))")
        }
        let explicit = try operations.explicitMaxConnections()
        guard let limit, limit.soft != Int.max else {
            let chosen = explicit ?? 0
            logger.info("max connections: \(chosen == 0 ? "no limit" : String(chosen))")
            return chosen
        }
        switch explicit {
        case nil:
            let derived = limit.defaultMaxConnections
            logger.info(
                "max connections: \(derived), from the descriptor limit \(limit.soft) less \(DescriptorLimit.headroom(soft: limit.soft)) kept for listeners, Redis, PostgreSQL, webhooks and files (--max-connections sets it)"
            )
            return derived
        case 0?:
            logger.notice(
                "max connections: no limit (--max-connections 0); the descriptor limit \(limit.soft) still bounds them")
            return 0
        case let given?:
            if limit.allows(maxConnections: given) {
                logger.info("max connections: \(given) (--max-connections)")
            } else {
                logger.warning(
                    "--max-connections \(given) is more than the descriptor limit \(limit.soft) allows (about \(limit.defaultMaxConnections) with room for other descriptors): past that, new connections are answered 503 through a reserve descriptor, or wait"
                )
            }
            return given
        }
    }

    private func describe(_ value: Int?) -> String {
        guard let value else { return "unknown" }
        return value == Int.max ? "unlimited" : String(value)
    }
}
