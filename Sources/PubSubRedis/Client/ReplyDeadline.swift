import NIOCore

/// When a connection with commands in flight counts as dead: no reply read for `timeout` while its event loop was
/// free to read one.
///
/// Counting from when the oldest command was sent turned a broker that was merely late (its event loop busy for
/// seconds, the replies already in the socket) into a lost connection, and lateness into loss. Here the clock runs
/// from the last reply read (or from the first command sent after a quiet spell), and a check that runs late (the
/// loop was stalled, so it could not have read either) gives the connection one more `period` instead of judging
/// it. A server that stops answering is still found within `timeout` plus a period or two. Time is an input.
struct ReplyDeadline {
    let timeout: TimeAmount
    /// How often `check` is meant to run.
    let period: TimeAmount
    private var lastProgress: NIODeadline?
    private var lastCheck: NIODeadline?

    init(timeout: TimeAmount, period: TimeAmount) {
        self.timeout = timeout
        self.period = period
    }

    /// A command was written; `idle`: none was waiting for a reply before it.
    mutating func sent(now: NIODeadline, idle: Bool) {
        if idle || lastProgress == nil { lastProgress = now }
    }

    /// Replies were read.
    mutating func replied(now: NIODeadline) {
        lastProgress = now
    }

    /// The periodic check: true when the connection is to be given up (`waiting`: replies are expected).
    mutating func check(now: NIODeadline, waiting: Bool) -> Bool {
        defer { lastCheck = now }
        guard waiting, let progress = lastProgress else { return false }
        if let lastCheck, now - lastCheck > period + period {
            // The loop was late: whatever Redis sent meanwhile may sit unread. One more period to read it.
            lastProgress = max(progress, now - timeout + period)
            return false
        }
        return now - progress > timeout
    }
}
