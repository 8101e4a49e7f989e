import Bayeux
import NIOCore
import NIOPosix

/// Subscribers held by worker processes, seen from the process that publishes (`pubsub bench --workers N`).
public protocol BenchRemoteSubscribers: Sendable {
    /// Connects every worker's subscribers; what is ready over all of them.
    func connect() async throws -> WorkerReady
    /// The measured window, in monotonic nanoseconds (CLOCK_MONOTONIC: one clock for every process of the machine).
    func startWindow(start: UInt64, end: UInt64) async throws
    /// `publishes` succeeded: each worker waits for all their deliveries until `deadline`, then reports.
    func finish(publishes: Int, deadline: UInt64) async throws -> [WorkerReport]
}

/// The lines between the coordinating process and a worker, one command or report per line.
public enum WorkerCommand: Sendable, Equatable {
    case window(start: UInt64, end: UInt64)
    case finish(publishes: Int, deadline: UInt64)

    public var line: String {
        switch self {
        case .window(let start, let end): "window \(start) \(end)"
        case .finish(let publishes, let deadline): "finish \(publishes) \(deadline)"
        }
    }

    public init?(line: String) {
        let words = line.split(separator: " ")
        guard words.count == 3 else { return nil }
        switch words[0] {
        case "window":
            guard let a = UInt64(words[1]), let b = UInt64(words[2]) else { return nil }
            self = .window(start: a, end: b)
        case "finish":
            guard let a = Int(words[1]), let b = UInt64(words[2]) else { return nil }
            self = .finish(publishes: a, deadline: b)
        default:
            return nil
        }
    }
}

extension BenchRunner {
    /// Runs as one worker process of a `--workers` run: connects this worker's subscribers, says how many are
    /// ready, counts deliveries over the window it is told, and reports once told how many publishes to expect.
    public func runWorker(
        readLine: @escaping @Sendable () async -> String?, writeLine: @escaping @Sendable (String) -> Void
    )
        async throws
    {
        let o = options
        guard o.scenario == .fanout, let runId = o.runId else {
            throw BenchError("a worker runs the fanout scenario of a run id")
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: o.threads)
        do {
            try await work(on: group, runId: runId, readLine: readLine, writeLine: writeLine)
            try? await group.shutdownGracefully()
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }

    private func work(
        on group: MultiThreadedEventLoopGroup, runId: String, readLine: @escaping @Sendable () async -> String?,
        writeLine: @escaping @Sendable (String) -> Void
    ) async throws {
        let o = options
        let loops = Array(group.makeIterator())
        let stats = loops.map { _ in LoopStats() }
        let shared = RunShared(options: o, runId: runId)
        let clients = (0..<o.subscribers).map { i in
            BenchClient(
                role: .subscriber(slot: i), shared: shared, stats: stats[i % loops.count], loop: loops[i % loops.count],
                index: i)
        }
        _ = await connectAll(clients, label: "subscribers")
        let connected = try await merged(loops, stats)
        writeLine(
            WorkerReady(
                ready: connected.connected, failed: connected.connectFailures, limit: connected.limit,
                errorSamples: connected.errorSamples
            ).json.jsonString)

        var start: ProcessSample?
        var finish: (publishes: Int, deadline: UInt64)?
        while finish == nil, let line = await readLine() {
            switch WorkerCommand(line: line) {
            case .window(let a, let b)?:
                for (loop, s) in zip(loops, stats) {
                    try await loop.submit {
                        s.windowStart = a
                        s.windowEnd = b
                    }.get()
                }
                start = ProcessSampler.sample(nil)
            case .finish(let publishes, let deadline)?:
                finish = (publishes, deadline)
            case nil:
                throw BenchError("unknown command from the coordinating process: \(line.prefix(80))")
            }
        }
        guard let finish else {
            for client in clients { client.loop.execute { client.close() } }
            return
        }
        let expected = finish.publishes * connected.connected
        while monotonicNanoseconds() < finish.deadline {
            var received = 0
            for (loop, s) in zip(loops, stats) { received += try await loop.submit { s.deliveries }.get() }
            if received >= expected { break }
            try await Task.sleep(nanoseconds: 20_000_000)
        }
        let end = ProcessSampler.sample(nil)
        let total = try await merged(loops, stats)
        let cpu = (start != nil && end != nil) ? end!.cpuSeconds - start!.cpuSeconds : 0
        writeLine(WorkerReport(total, cpuSeconds: cpu, rssBytes: end?.rssBytes ?? 0).json.jsonString)
        for client in clients { client.loop.execute { client.close() } }
    }

    /// The statistics of every event loop merged into one, each copied on its own loop.
    func merged(_ loops: [any EventLoop], _ stats: [LoopStats]) async throws -> LoopStats {
        let total = LoopStats()
        for (loop, s) in zip(loops, stats) {
            let copy = try await loop.submit { () -> LoopStats in
                let c = LoopStats()
                c.merge(s)
                return c
            }.get()
            total.merge(copy)
        }
        return total
    }
}
