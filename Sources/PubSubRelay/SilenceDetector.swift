import NIOCore

/// When a feed's server last showed life, and what its silence means: the one rule of every source that keeps a
/// connection open (PostgreSQL's replication stream, CouchDB's continuous feed, Simperium's WebSocket).
///
/// A server that says nothing for `quiet` is asked to answer (a probe: a status that asks for a reply, a heartbeat),
/// and given up when the answer does not come within `answer`; a source that cannot ask gives up after `quiet`. While
/// the reader waits for the relay to take what it read, nothing is read: the server is not to blame, and the wait
/// does not count. Time is an input.
struct SilenceDetector: Sendable, Equatable {
    enum Verdict: Sendable, Equatable {
        case fine
        /// Ask the server to answer now.
        case probe
        /// The connection is dead: nothing for `silence`.
        case dead(silence: TimeAmount)
    }

    let quiet: TimeAmount
    /// How long a probe may go unanswered; nil for a source that cannot ask.
    let answer: TimeAmount?
    private(set) var lastHeard: NIODeadline
    private(set) var probeSent: NIODeadline?
    private(set) var waiting = false

    init(quiet: TimeAmount, answer: TimeAmount?, now: NIODeadline) {
        self.quiet = quiet
        self.answer = answer
        self.lastHeard = now
    }

    /// Something came from the server.
    mutating func heard(now: NIODeadline) {
        lastHeard = now
    }

    /// The server answered the probe (with a source whose every message answers it, call this for every message).
    mutating func answered(now: NIODeadline) {
        lastHeard = now
        probeSent = nil
    }

    /// The reader waits for the relay: the silence from now on is not the server's.
    mutating func wait() {
        waiting = true
    }

    /// The reader reads again: the silence counts from now (and so does the wait for a probe's answer).
    mutating func resume(now: NIODeadline) {
        waiting = false
        lastHeard = now
        if probeSent != nil { probeSent = now }
    }

    /// What the silence means at `now`; a `probe` verdict counts as the probe sent.
    mutating func check(now: NIODeadline) -> Verdict {
        guard !waiting else { return .fine }
        if let probeSent, let answer {
            return now - probeSent > answer ? .dead(silence: now - lastHeard) : .fine
        }
        guard answer != nil else { return now - lastHeard > quiet ? .dead(silence: now - lastHeard) : .fine }
        guard now - lastHeard >= quiet else { return .fine }
        probeSent = now
        return .probe
    }
}
