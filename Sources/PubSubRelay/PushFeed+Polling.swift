/// A feed that is pulled (PostgreSQL's slot, read with `pg_logical_slot_peek_changes`) on the same reader, backoff
/// and stream as the feeds that push. One connection is: `open` (connect, find where to resume), then polls for as
/// long as it lives, each poll handing its batches over with `hand` as it reads them (the relay publishes a batch
/// while the next one of the same poll is read). Between two polls:
///
/// - the reader waits until the relay acknowledged every batch handed over (`settled()`), so the next poll starts
///   where the source may confirm to its server (advance the slot) exactly what the broker acknowledged, and does
///   not read again what is still being published (a peek decodes again everything after the slot's position);
/// - it rests `interval` after a poll that drained the feed, and polls again at once after a full one.
///
/// A new connection also waits for the acknowledgements first, so that it resumes after everything handed over.
extension PushFeed {
    /// What one poll found.
    enum Poll: Sendable, Equatable {
        /// As much as one poll reads: there may be more, poll again at once.
        case full
        /// Less than that, or nothing: the feed was drained when it was read; rest before the next poll.
        case drained

        /// The rest before the poll after this one: none after a full poll, `interval` after one that drained it.
        func rest(_ interval: Duration) -> Duration? {
            self == .full ? nil : interval
        }
    }

    /// Starts the reader after `position`: for each connection `open(resume)` once, then `poll()` again and again
    /// until it throws; `ended` says what follows, as for a feed that pushes.
    func startPolling(
        after position: String?, backoff: Backoff, interval: Duration,
        open: @escaping @Sendable (_ resume: String?) async throws -> Void,
        poll: @escaping @Sendable () async throws -> Poll,
        ended: @escaping @Sendable (_ error: (any Error)?, _ backoff: Backoff) async -> Next
    ) {
        start(
            after: position, backoff: backoff,
            connect: { [self] resume in
                try await settled()
                try await open(resume)
                while true {
                    let found = try await poll()
                    if let rest = found.rest(interval) { try await Task.sleep(for: rest) }
                    try await settled()
                }
            },
            ended: ended)
    }
}

/// Batches handed to the relay and acknowledged by it, counted: a batch is acknowledged once, in the order handed,
/// so the relay is done with every one of them when both counts meet.
struct Acknowledgements: Sendable, Equatable {
    private(set) var handedCount: UInt64 = 0
    private(set) var acknowledgedCount: UInt64 = 0

    var isSettled: Bool { acknowledgedCount >= handedCount }

    mutating func handed() { handedCount &+= 1 }

    /// Counts one acknowledgement; returns whether every batch handed over is now acknowledged. One more than was
    /// handed (a source confirming a position it did not hand over) is ignored.
    mutating func acknowledged() -> Bool {
        if acknowledgedCount < handedCount { acknowledgedCount &+= 1 }
        return isSettled
    }
}
