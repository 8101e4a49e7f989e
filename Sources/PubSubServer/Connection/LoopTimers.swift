import NIOCore

/// The timers of every connection on one event loop: the connection guards' deadlines and the holds of held
/// connects sit in one `TimerQueue`, and one NIO scheduled callback is armed for the earliest. A connection
/// costs an entry in a shared array instead of a scheduled task (task, closure, promise) of its own.
///
/// Used on its event loop only (its state is loop-bound: touched off the loop, it traps). A deadline moved later
/// leaves the callback armed: it fires, finds nothing due and re-arms for the next.
final class LoopTimers: NIOScheduledCallbackHandler, Sendable {
    let eventLoop: any EventLoop
    private let state: NIOLoopBoundBox<State>

    private struct State {
        var queue = TimerQueue()
        var armed: NIOScheduledCallback?
        var armedDeadline: NIODeadline?
    }

    init(eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
        self.state = .makeBoxSendingValue(State(), eventLoop: eventLoop)
    }

    /// How many deadlines are set (for tests).
    var count: Int { state.value.queue.count }

    /// The deadline of `owner`, if it has one.
    func deadline(of owner: any TimerQueueOwner) -> NIODeadline? {
        state.value.queue.deadline(of: owner)
    }

    /// Sets `owner`'s deadline (replacing any): `timerQueueDeadlineReached()` is called once it has come.
    func schedule(_ owner: any TimerQueueOwner, at deadline: NIODeadline) {
        state.value.queue.schedule(owner, at: deadline)
        rearm()
    }

    func cancel(_ owner: any TimerQueueOwner) {
        state.value.queue.cancel(owner)
        if state.value.queue.isEmpty { disarm() }
    }

    func handleScheduledCallback(eventLoop: some EventLoop) {
        state.value.armed = nil
        state.value.armedDeadline = nil
        let now = self.eventLoop.now
        while let owner = state.value.queue.popDue(now: now) {
            owner.timerQueueDeadlineReached()
        }
        rearm()
    }

    private func rearm() {
        guard let earliest = state.value.queue.earliest else { return }
        if let armedDeadline = state.value.armedDeadline, armedDeadline <= earliest { return }
        state.value.armed?.cancel()
        state.value.armedDeadline = earliest
        // Fails only when the loop is shutting down, and its connections with it.
        state.value.armed = try? eventLoop.assumeIsolated().scheduleCallback(at: earliest, handler: self)
    }

    private func disarm() {
        state.value.armed?.cancel()
        state.value.armed = nil
        state.value.armedDeadline = nil
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
