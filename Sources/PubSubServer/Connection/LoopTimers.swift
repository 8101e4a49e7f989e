import NIOCore

/// The timers of every connection on one event loop: the connection guards' deadlines and the holds of held
/// connects sit in one `TimerQueue`, and one NIO scheduled callback is armed for the earliest. A connection
/// costs an entry in a shared array instead of a scheduled task (task, closure, promise) of its own.
///
/// Used on its event loop only. A deadline moved later leaves the callback armed: it fires, finds nothing due and
/// re-arms for the next.
final class LoopTimers: NIOScheduledCallbackHandler, @unchecked Sendable {
    let eventLoop: any EventLoop
    private var queue = TimerQueue()
    private var armed: NIOScheduledCallback?
    private var armedDeadline: NIODeadline?

    init(eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    /// How many deadlines are set (for tests).
    var count: Int { queue.count }

    /// The deadline of `owner`, if it has one.
    func deadline(of owner: any TimerQueueOwner) -> NIODeadline? {
        queue.deadline(of: owner)
    }

    /// Sets `owner`'s deadline (replacing any): `timerQueueDeadlineReached()` is called once it has come.
    func schedule(_ owner: any TimerQueueOwner, at deadline: NIODeadline) {
        queue.schedule(owner, at: deadline)
        rearm()
    }

    func cancel(_ owner: any TimerQueueOwner) {
        queue.cancel(owner)
        if queue.isEmpty { disarm() }
    }

    func handleScheduledCallback(eventLoop: some EventLoop) {
        armed = nil
        armedDeadline = nil
        let now = self.eventLoop.now
        while let owner = queue.popDue(now: now) {
            owner.timerQueueDeadlineReached()
        }
        rearm()
    }

    private func rearm() {
        guard let earliest = queue.earliest else { return }
        if let armedDeadline, armedDeadline <= earliest { return }
        armed?.cancel()
        armedDeadline = earliest
        // Fails only when the loop is shutting down, and its connections with it.
        armed = try? eventLoop.assumeIsolated().scheduleCallback(at: earliest, handler: self)
    }

    private func disarm() {
        armed?.cancel()
        armed = nil
        armedDeadline = nil
    }
}

/// The `LoopTimers` of each event loop of a server, made once.
struct LoopTimerTable: Sendable {
    private let table: [ObjectIdentifier: LoopTimers]

    init(loops: [any EventLoop]) {
        var table: [ObjectIdentifier: LoopTimers] = [:]
        for loop in loops { table[ObjectIdentifier(loop)] = LoopTimers(eventLoop: loop) }
        self.table = table
    }

    /// The timers of `loop`; a loop outside the group (a test's embedded loop) gets timers of its own.
    func timers(for loop: any EventLoop) -> LoopTimers {
        table[ObjectIdentifier(loop)] ?? LoopTimers(eventLoop: loop)
    }
}
