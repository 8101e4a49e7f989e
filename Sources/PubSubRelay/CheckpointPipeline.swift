import NIOPosix
import Synchronization

/// Checkpoints written behind the publishes. The relay publishes batch after batch while the checkpoint of the
/// batches before is made durable: one write at a time, each covering every batch the broker acknowledged since
/// the last write began (its newest position), and the source is confirmed batch by batch, in order, only once a
/// write covering the batch is durable. A durable write costs what the disk costs (a rename and two fsyncs: from
/// a millisecond to most of a second on a busy disk); publishing no longer waits for it, only confirming does.
///
/// What a crash loses is unchanged: a restart resumes from the last durable checkpoint, and what was published
/// after it is published again with the same keys. `capacity` bounds the acknowledged positions waiting for the
/// next write: once that many wait, the relay waits for the write under way before it publishes more.
struct CheckpointPipeline: Sendable, Equatable {
    /// One durable write: the checkpoint `position`, then the confirms of every batch it covers, in order.
    struct Write: Sendable, Equatable {
        var position: String
        var confirms: [String]
    }

    let capacity: Int
    /// Acknowledged by the broker, waiting for the next write.
    private(set) var waiting: [String] = []
    /// The write under way.
    private(set) var writing: Write?

    init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    /// Whether the relay may publish another batch before the write under way ends.
    var hasRoom: Bool { waiting.count < capacity }
    /// Nothing acknowledged is waiting for a write or being written.
    var isIdle: Bool { writing == nil && waiting.isEmpty }

    /// The broker acknowledged every message of the batch at `position`.
    mutating func acknowledged(_ position: String) {
        waiting.append(position)
    }

    /// The next write, when none is under way and something waits for one.
    mutating func startWrite() -> Write? {
        guard writing == nil, let position = waiting.last else { return nil }
        let write = Write(position: position, confirms: waiting)
        waiting = []
        writing = write
        return write
    }

    /// The write under way is durable and its batches are confirmed.
    mutating func written() {
        writing = nil
    }
}

/// Performs a `CheckpointPipeline` for `Relay.run`: `acknowledged` on the relay's side, `run` as the writer task.
/// The writer saves each checkpoint on NIO's thread pool (the fsyncs block a thread, never the cooperative pool's)
/// and finishes the write under way even when the relay is cancelled, so that a stopped relay leaves its newest
/// checkpoint behind.
final class CheckpointWriter: Sendable {
    private struct State {
        var pipeline: CheckpointPipeline
        var finished = false
        var failure: (any Error)?
        /// The writer, waiting for something to write.
        var writer: CheckedContinuation<CheckpointPipeline.Write?, Never>?
        /// The relay, waiting for room.
        var relay: CheckedContinuation<Void, any Error>?
    }

    private let state: Mutex<State>

    init(capacity: Int) {
        state = Mutex(State(pipeline: CheckpointPipeline(capacity: capacity)))
    }

    /// The broker acknowledged the batch at `position`: it is written with the next write, and this returns at
    /// once unless `capacity` positions already wait (then it waits for the write under way). Throws the writer's
    /// error once a write failed.
    func acknowledged(_ position: String) async throws {
        var writer: CheckedContinuation<CheckpointPipeline.Write?, Never>?
        var full = false
        let write: CheckpointPipeline.Write? = try state.withLock { state in
            if let failure = state.failure { throw failure }
            state.pipeline.acknowledged(position)
            if let waiting = state.writer, let write = state.pipeline.startWrite() {
                writer = waiting
                state.writer = nil
                return write
            }
            full = !state.pipeline.hasRoom
            return nil
        }
        if let writer { writer.resume(returning: write) }
        guard full else { return }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let ready: Result<Void, any Error>? = state.withLock { state in
                if let failure = state.failure { return .failure(failure) }
                if state.pipeline.hasRoom { return .success(()) }
                state.relay = continuation
                return nil
            }
            if let ready { continuation.resume(with: ready) }
        }
    }

    /// No more acknowledgements: the writer writes what waits, then `run` returns.
    func finish() {
        let writer = state.withLock { state -> CheckedContinuation<CheckpointPipeline.Write?, Never>? in
            state.finished = true
            defer { state.writer = nil }
            return state.writer
        }
        writer?.resume(returning: nil)
    }

    /// The writer task: each write in turn (`save`, then `confirm` of each position it covers), until `finish()`
    /// and nothing waits. A failed write is thrown, and from then on `acknowledged` throws it too.
    func run(
        save: @escaping @Sendable (String) throws -> Void, confirm: @escaping @Sendable (String) async throws -> Void
    ) async throws {
        while let write = await next() {
            // Not cancelled with the relay: a stopped relay still leaves the write it began.
            let done = Task {
                try await NIOThreadPool.singleton.runIfActive { try save(write.position) }
                for position in write.confirms { try await confirm(position) }
            }
            do {
                try await done.value
            } catch {
                let relay = state.withLock { state in
                    state.failure = error
                    defer { state.relay = nil }
                    return state.relay
                }
                relay?.resume(throwing: error)
                throw error
            }
            state.withLock { $0.pipeline.written() }
        }
    }

    /// The next write, waiting for one; nil once finished with nothing left to write.
    private func next() async -> CheckpointPipeline.Write? {
        await withCheckedContinuation { (continuation: CheckedContinuation<CheckpointPipeline.Write?, Never>) in
            var relay: CheckedContinuation<Void, any Error>?
            var ready = true
            let write: CheckpointPipeline.Write? = state.withLock { state in
                if let write = state.pipeline.startWrite() {
                    relay = state.relay
                    state.relay = nil
                    return write
                }
                if !state.finished {
                    state.writer = continuation
                    ready = false
                }
                return nil
            }
            relay?.resume()
            if ready { continuation.resume(returning: write) }
        }
    }
}
