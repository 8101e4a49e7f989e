import ArgumentParser
import Bayeux
import Foundation
import PubSubBench

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The worker processes of `pubsub bench --workers N`: child `pubsub bench --worker` processes, each holding a share
/// of the subscribers under its own descriptor limit, spoken to over their standard input and output, one line
/// each way per step.
// @unchecked: immutable after init: its processes, pipes and readers are only read; each reader keeps its own state.
final class ProcessWorkers: BenchRemoteSubscribers, @unchecked Sendable {
    let runId: String
    let plan: WorkerPlan
    private let processes: [Process]
    private let inputs: [FileHandle]
    private let outputs: [LineReader]

    init(options: BenchOptions, workers: Int, sourceAddresses: [String], perAddress: Int, descriptorLimit: Int) throws {
        runId = options.runId ?? String(UInt32.random(in: 0...UInt32.max), radix: 36)
        var addresses = sourceAddresses
        let loopback = options.targets.allSatisfy { $0.host.hasPrefix("127.") || $0.host == "localhost" }
        if addresses.isEmpty, loopback {
            // Enough loopback addresses that every worker has its own, `perAddress` connections each.
            var needed = 0
            for w in 0..<workers {
                let share = options.subscribers / workers + (w < options.subscribers % workers ? 1 : 0)
                needed += max(1, (share + perAddress - 1) / perAddress)
            }
            addresses = WorkerPlan.loopbackAddresses(count: needed)
        }
        plan = try WorkerPlan(
            subscribers: options.subscribers, workers: workers, addresses: addresses, perAddress: perAddress,
            descriptorLimit: descriptorLimit)
        let executable = URL(
            fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
                ?? CommandLine.arguments[0])
        var processes: [Process] = []
        var inputs: [FileHandle] = []
        var outputs: [LineReader] = []
        var first = 0
        for share in plan.shares {
            defer { first += share.subscribers }
            var arguments = [
                "bench", "--worker", "--quiet", "--first-index", String(first), "--run-id", runId, "--scenario",
                "fanout",
                "--transport", options.transport.rawValue, "--subscribers", String(share.subscribers),
                "--publishers", String(options.publishers), "--rate", String(options.rate),
                "--size", String(options.payloadBytes), "--threads", String(options.threads),
                "--connect-concurrency", String(options.connectConcurrency),
                "--connect-timeout", String(options.connectTimeout), "--per-address", String(perAddress),
            ]
            arguments += ["--payload", options.payload.rawValue]
            if options.compression { arguments.append("--compression") }
            arguments += ["--protocol", options.serverProtocol.rawValue]
            for url in options.targets { arguments += ["--url", url.description] }
            for address in share.sourceAddresses { arguments += ["--source-address", address] }
            let process = Process()
            process.executableURL = executable
            process.arguments = arguments
            let input = Pipe()
            let output = Pipe()
            process.standardInput = input
            process.standardOutput = output
            process.standardError = FileHandle.standardError
            do {
                try process.run()
            } catch {
                for p in processes { p.terminate() }
                throw BenchError("cannot start worker process \(executable.path): \(error)")
            }
            processes.append(process)
            inputs.append(input.fileHandleForWriting)
            outputs.append(LineReader(output.fileHandleForReading.fileDescriptor))
        }
        self.processes = processes
        self.inputs = inputs
        self.outputs = outputs
    }

    func connect() async throws -> WorkerReady {
        var total = WorkerReady(ready: 0, failed: 0)
        for (i, reader) in outputs.enumerated() {
            let line = try await line(from: reader, worker: i)
            guard let ready = (try? JSONParser().parse(line)).flatMap(WorkerReady.init(json:)) else {
                throw BenchError("worker \(i + 1) said \(line.prefix(120))")
            }
            total.ready += ready.ready
            total.failed += ready.failed
            total.limit = total.limit ?? ready.limit
            for sample in ready.errorSamples where total.errorSamples.count < 8 && !total.errorSamples.contains(sample)
            {
                total.errorSamples.append(sample)
            }
        }
        return total
    }

    func startWindow(start: UInt64, end: UInt64) async throws {
        send(.window(start: start, end: end))
    }

    func finish(publishes: Int, deadline: UInt64) async throws -> [WorkerReport] {
        send(.finish(publishes: publishes, deadline: deadline))
        var reports: [WorkerReport] = []
        for (i, reader) in outputs.enumerated() {
            let line = try await line(from: reader, worker: i)
            guard let report = (try? JSONParser().parse(line)).flatMap(WorkerReport.init(json:)) else {
                throw BenchError("worker \(i + 1) reported \(line.prefix(120))")
            }
            reports.append(report)
        }
        return reports
    }

    /// Ends the workers (they exit by themselves once they reported; this is for a run that stopped early).
    func terminate() {
        for input in inputs { try? input.close() }
        for process in processes where process.isRunning { process.terminate() }
    }

    private func send(_ command: WorkerCommand) {
        let data = Data((command.line + "\n").utf8)
        for input in inputs { try? input.write(contentsOf: data) }
    }

    private func line(from reader: LineReader, worker i: Int) async throws -> String {
        if let line = await reader.next() { return line }
        let process = processes[i]
        process.waitUntilExit()
        throw BenchError(
            "worker process \(i + 1) exited with status \(process.terminationStatus) (\(process.terminationReason == .uncaughtSignal ? "killed by a signal: out of memory?" : "see its error above"))"
        )
    }
}

/// Reads lines from a descriptor on a queue of its own (blocking reads, off the event loops and the tasks).
// @unchecked: `buffer` and `ended` are guarded by the serial `queue`: one read at a time, on it.
final class LineReader: @unchecked Sendable {
    private let fd: Int32
    private let queue = DispatchQueue(label: "pubsub.bench.lines")
    private var buffer: [UInt8] = []
    private var ended = false

    init(_ fd: Int32) { self.fd = fd }

    func next() async -> String? {
        await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: self.readLine()) }
        }
    }

    private func readLine() -> String? {
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[..<newline], as: UTF8.self)
                buffer.removeSubrange(...newline)
                return line
            }
            if ended { return nil }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n > 0 {
                buffer += chunk[..<n]
            } else if n < 0, errno == EINTR {
                continue
            } else {
                ended = true
                if buffer.isEmpty { return nil }
                let line = String(decoding: buffer, as: UTF8.self)
                buffer = []
                return line
            }
        }
    }
}

extension Bench {
    /// `pubsub bench --worker`: one worker of a `--workers` run, talking to its parent over stdin and stdout.
    func runAsWorker(_ options: BenchOptions) async throws {
        let input = LineReader(0)
        let runner = BenchRunner(options: options)
        do {
            try await runner.runWorker(
                readLine: { await input.next() },
                writeLine: { line in
                    let text = line + "\n"
                    _ = text.utf8.withContiguousStorageIfAvailable { write(1, $0.baseAddress, $0.count) }
                })
        } catch {
            writeStandardError("pubsub bench worker: \(error)\n")
            throw ExitCode.failure
        }
    }
}
