import NIOConcurrencyHelpers
import NIOCore

/// Sends the systemd watchdog ping only while every event loop of the server runs tasks.
///
/// Each tick (scheduled on the first loop) submits an empty task to every loop and pings once all of them have
/// run it. A round that has not finished by the next tick is not restarted: while any loop is stuck (a blocked
/// thread, a deadlock, a handler spinning) no ping is sent, and systemd restarts the service after `WatchdogSec=`.
final class Watchdog: Sendable {
    private let loops: [any EventLoop]
    private let ping: @Sendable () -> Void
    private let state = NIOLockedValueBox<(task: RepeatedTask?, roundInFlight: Bool)>((nil, false))

    init(loops: [any EventLoop], ping: @escaping @Sendable () -> Void) {
        precondition(!loops.isEmpty)
        self.loops = loops
        self.ping = ping
    }

    /// Starts ticking every `period` (half of systemd's `WATCHDOG_USEC`); the first round runs at once.
    func start(every period: TimeAmount) {
        let task = loops[0].scheduleRepeatedTask(initialDelay: .zero, delay: period) { [self] _ in tick() }
        state.withLockedValue { $0.task = task }
    }

    func stop() {
        let task = state.withLockedValue { s -> RepeatedTask? in
            defer { s.task = nil }
            return s.task
        }
        task?.cancel()
    }

    private func tick() {
        let startRound = state.withLockedValue { s -> Bool in
            guard s.task != nil, !s.roundInFlight else { return false }
            s.roundInFlight = true
            return true
        }
        guard startRound else { return }
        let rounds = loops.map { $0.submit {} }
        EventLoopFuture.andAllComplete(rounds, on: loops[0]).whenComplete { [self] _ in
            let running = state.withLockedValue { s -> Bool in
                s.roundInFlight = false
                return s.task != nil
            }
            if running { ping() }
        }
    }
}
