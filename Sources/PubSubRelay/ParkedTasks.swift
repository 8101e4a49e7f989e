import Synchronization

/// Tasks parked until a condition on state kept elsewhere holds. `wait(while:)` parks the calling task while
/// `blocked()` is true; whoever changes that state calls `wakeAll()` afterwards, and every parked task asks again.
/// `blocked()` is asked under this type's lock and `wakeAll()` takes the same lock, so a change made before a wake
/// is seen either by the question or by the wake: no wake-up is missed. A task cancelled while parked goes on at once.
final class ParkedTasks: Sendable {
    private struct Parked {
        var lastID: UInt64 = 0
        var tasks: [UInt64: CheckedContinuation<Void, Never>] = [:]
    }

    private let parked = Mutex(Parked())

    /// How many tasks are parked (for tests).
    var count: Int { parked.withLock { $0.tasks.count } }

    /// Returns once `blocked()` is false, or the task is cancelled (the caller checks which it was).
    func wait(while blocked: () -> Bool) async {
        let id = parked.withLock { parked -> UInt64 in
            parked.lastID &+= 1
            return parked.lastID
        }
        while true {
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let parking = parked.withLock { parked -> Bool in
                        guard blocked(), !Task.isCancelled else { return false }
                        parked.tasks[id] = continuation
                        return true
                    }
                    if !parking { continuation.resume() }
                }
            } onCancel: {
                parked.withLock { $0.tasks.removeValue(forKey: id) }?.resume()
            }
            if Task.isCancelled || !blocked() { return }
        }
    }

    /// Wakes every parked task: each one asks its condition again.
    func wakeAll() {
        let tasks = parked.withLock { parked -> [CheckedContinuation<Void, Never>] in
            defer { parked.tasks = [:] }
            return Array(parked.tasks.values)
        }
        for task in tasks { task.resume() }
    }
}
