import NIOCore

/// The pause before trying again after a failure: `initial` first, doubling after each failure up to `maximum`, and
/// back to `initial` once things went well again (traffic on a new connection, a feed that ran a while). One value
/// for every loop of the relay that retries (a lost feed connection, a refused publish, a restarted feed), so the
/// schedule is written once and tested without a clock.
public struct Backoff: Sendable, Equatable {
    public let initial: Duration
    public let maximum: Duration
    /// The pause the next failure waits.
    public private(set) var current: Duration

    public init(initial: Duration, maximum: Duration) {
        self.initial = initial
        self.maximum = max(initial, maximum)
        self.current = initial
    }

    public init(initial: TimeAmount, maximum: TimeAmount) {
        self.init(
            initial: Duration.nanoseconds(initial.nanoseconds), maximum: Duration.nanoseconds(maximum.nanoseconds))
    }

    /// The pause for this failure; the one after it is twice as long (at most `maximum`).
    public mutating func next() -> Duration {
        defer { current = min(current * 2, maximum) }
        return current
    }

    /// Starts over from `initial` (the last attempt went well).
    public mutating func reset() { current = initial }

    /// Sleeps for the pause of this failure; throws `CancellationError` when the task is cancelled meanwhile.
    public mutating func wait() async throws {
        try await Task.sleep(for: next())
    }

    /// The pause in whole milliseconds, for logs.
    public static func milliseconds(_ duration: Duration) -> Int64 {
        duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
    }
}
