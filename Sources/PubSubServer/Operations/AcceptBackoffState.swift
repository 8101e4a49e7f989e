import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// What a listening socket does when `accept` fails, as a pure state machine (`AcceptBackoffStateTests`); the
/// `AcceptGuard` handler performs its actions.
///
/// Without it, a listener whose `accept` fails with EMFILE (every descriptor of the process in use) is told
/// at once that the socket is readable again, fails again, and so burns a core while the clients that wait
/// in the kernel's backlog hang. Instead:
/// - The listener holds one **reserve descriptor** (an open `/dev/null`). On EMFILE or ENFILE it is closed and
///   one connection is accepted into the freed slot: that connection is **shed** (answered 503 and closed,
///   `ServerOperations.refuseIfShed`), and the reserve is opened again once it has closed.
/// - While no reserve is at hand, or on ENOBUFS/ENOMEM, the listener is **paused** (it stops polling its
///   socket) and resumes after a backoff: 20 ms at first, doubling up to 1 s; a connection accepted normally
///   resets it. A shed connection that closed brings the reserve back and the listener resumes at once, so a
///   queue of waiting clients is answered one after the other instead of a second apart.
/// - A **burst** of failures is logged once when it begins, at most once per `reportInterval` while it lasts
///   (with what was counted meanwhile), and once when it ends (no failure for `quietPeriod`).
struct AcceptBackoffState {
    /// How an accept failed.
    enum Failure: String, Equatable, Sendable, CaseIterable {
        /// EMFILE or ENFILE: no descriptor left for the process or the system. The reserve helps.
        case descriptors
        /// ENOBUFS or ENOMEM: the kernel is short of memory. Only waiting helps.
        case memory

        /// Nil for an error that concerns one connection only (ECONNABORTED: it went away before it was
        /// accepted) or that is not an accept failure: the next accept goes on as usual.
        init?(errno code: CInt) {
            switch code {
            case EMFILE, ENFILE: self = .descriptors
            case ENOBUFS, ENOMEM: self = .memory
            default: return nil
            }
        }
    }

    enum Reserve: Equatable {
        /// Open, ready to be given up.
        case held
        /// Closed for the next accept, which is shed.
        case released
        /// Its slot is used by a shed connection still open.
        case lent
        /// Could not be opened (again): retried at `reserveRetryAt`.
        case missing
    }

    struct Settings: Equatable {
        var firstDelay: TimeAmount = .milliseconds(20)
        var maxDelay: TimeAmount = .seconds(1)
        var reportInterval: TimeAmount = .seconds(10)
        var quietPeriod: TimeAmount = .seconds(2)
    }

    /// A log line to write.
    enum Report: Equatable {
        /// The first failure of a burst.
        case began(Failure)
        /// A burst goes on: failures and shed connections since the last report.
        case continuing(failures: Int, shed: Int)
        /// No failure for the quiet period: totals of the whole burst, and how long it lasted (first to last failure).
        case ended(failures: Int, shed: Int, lasted: TimeAmount)
    }

    struct FailureAction: Equatable {
        /// Close the reserve descriptor and go on accepting: the next connection accepted is shed.
        var releaseReserve = false
        /// Stop polling the listening socket until `timerFired` or `reserveReturned` says to resume.
        var pause = false
        var report: Report?
    }

    enum Admission: Equatable {
        case admit
        /// Accepted into the reserve's slot: answer 503 and close; call `reserveReturned` when it has closed.
        case shed
    }

    struct TimerAction: Equatable {
        var reopenReserve = false
        /// Poll the listening socket again.
        var resume = false
        var report: Report?
    }

    private struct Burst: Equatable {
        var began: NIODeadline
        var lastFailure: NIODeadline
        var failures = 1
        var shed = 0
        var lastReport: NIODeadline
        var failuresReported = 0
        var shedReported = 0
    }

    let settings: Settings
    private(set) var reserve: Reserve
    /// The current backoff delay; nil when accepting works.
    private(set) var delay: TimeAmount?
    /// Whether the listener is paused, and until when.
    private(set) var pausedUntil: NIODeadline?
    private(set) var reserveRetryAt: NIODeadline?
    private var burst: Burst?

    init(settings: Settings = Settings(), reserveOpened: Bool, now: NIODeadline) {
        self.settings = settings
        self.reserve = reserveOpened ? .held : .missing
        self.reserveRetryAt = reserveOpened ? nil : now + settings.maxDelay
    }

    var inBurst: Bool { burst != nil }

    /// When `timerFired(now:)` is next due; nil when nothing is.
    var deadline: NIODeadline? {
        var candidates: [NIODeadline] = []
        if let pausedUntil { candidates.append(pausedUntil) }
        if reserve == .missing, let reserveRetryAt { candidates.append(reserveRetryAt) }
        if let burst {
            candidates.append(burst.lastFailure + settings.quietPeriod)
            if burst.failures > burst.failuresReported || burst.shed > burst.shedReported {
                candidates.append(burst.lastReport + settings.reportInterval)
            }
        }
        return candidates.min()
    }

    // MARK: Events

    mutating func acceptFailed(_ failure: Failure, now: NIODeadline) -> FailureAction {
        var action = FailureAction()
        if var current = burst {
            current.failures += 1
            current.lastFailure = now
            burst = current
            action.report = dueReport(now: now)
        } else {
            burst = Burst(began: now, lastFailure: now, lastReport: now, failuresReported: 1)
            action.report = .began(failure)
        }
        if failure == .descriptors, reserve == .held {
            reserve = .released
            action.releaseReserve = true
            return action
        }
        if reserve == .released {
            // The freed slot went to another descriptor of the process before the accept could take it.
            reserve = .missing
            reserveRetryAt = now + settings.maxDelay
        }
        let next = delay.map { min(settings.maxDelay, $0 + $0) } ?? settings.firstDelay
        delay = next
        action.pause = pausedUntil == nil
        pausedUntil = now + next
        return action
    }

    /// A connection was accepted. While the reserve is released, the handler first tries to open it again
    /// (`reserveReopened`): when that works there were descriptors to spare after all (some closed meanwhile), and
    /// the connection is admitted; when it fails the connection took the reserve's slot and is shed.
    mutating func accepted(now: NIODeadline, reserveReopened: Bool = false) -> Admission {
        if reserve == .released {
            if !reserveReopened {
                reserve = .lent
                burst?.shed += 1
                return .shed
            }
            reserve = .held
        }
        delay = nil
        return .admit
    }

    /// A shed connection has closed and the reserve was opened again (`reopened`) or could not be. Returns
    /// whether to resume now.
    mutating func reserveReturned(reopened: Bool, now: NIODeadline) -> Bool {
        guard reserve == .lent || reserve == .missing else { return false }
        return reserveOpened(reopened, now: now)
    }

    mutating func timerFired(now: NIODeadline) -> TimerAction {
        var action = TimerAction()
        if reserve == .missing, let reserveRetryAt, now >= reserveRetryAt { action.reopenReserve = true }
        if let pausedUntil, now >= pausedUntil {
            self.pausedUntil = nil
            action.resume = true
        }
        if let current = burst {
            if now >= current.lastFailure + settings.quietPeriod {
                burst = nil
                action.report = .ended(
                    failures: current.failures, shed: current.shed, lasted: current.lastFailure - current.began)
            } else {
                action.report = dueReport(now: now)
            }
        }
        return action
    }

    /// The outcome of a reopening asked for by `timerFired`. Returns whether to resume now.
    mutating func reserveReopened(_ opened: Bool, now: NIODeadline) -> Bool {
        guard reserve == .missing else { return false }
        return reserveOpened(opened, now: now)
    }

    // MARK: Helpers

    private mutating func reserveOpened(_ opened: Bool, now: NIODeadline) -> Bool {
        if opened {
            reserve = .held
            reserveRetryAt = nil
            // With the reserve back, the next failure sheds a connection: no reason to wait for the backoff.
            guard pausedUntil != nil else { return false }
            pausedUntil = nil
            return true
        }
        reserve = .missing
        reserveRetryAt = now + settings.maxDelay
        return false
    }

    /// A `.continuing` report when one is due and there is something new to say.
    private mutating func dueReport(now: NIODeadline) -> Report? {
        guard var current = burst, now >= current.lastReport + settings.reportInterval else { return nil }
        let failures = current.failures - current.failuresReported
        let shed = current.shed - current.shedReported
        guard failures > 0 || shed > 0 else { return nil }
        current.lastReport = now
        current.failuresReported = current.failures
        current.shedReported = current.shed
        burst = current
        return .continuing(failures: failures, shed: shed)
    }
}
