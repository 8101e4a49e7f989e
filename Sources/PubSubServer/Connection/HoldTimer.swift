import NIOCore

/// The timer of a held `/meta/connect`, armed and cancelled as a connection's `ConnectionStateMachine` asks
/// (`.armHoldTimer`, `.cancelHoldTimer`, an answer); used on the handler's event loop only.
struct HoldTimer {
    private var scheduled: Scheduled<Void>?

    /// Replaces any armed hold: `fire` runs on `loop` after `hold` unless cancelled first.
    mutating func arm(in hold: TimeAmount, on loop: any EventLoop, fire: @escaping () -> Void) {
        scheduled?.cancel()
        scheduled = loop.assumeIsolated().scheduleTask(in: hold, fire)
    }

    /// The hold ran out: nothing is left to cancel (a cancel would search the loop's scheduled tasks for nothing).
    mutating func fired() {
        scheduled = nil
    }

    mutating func cancel() {
        scheduled?.cancel()
        scheduled = nil
    }
}
