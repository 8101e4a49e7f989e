import ArgumentParser
import NIOCore
import PubSubBench

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Load-test a Bayeux server (pubsub, Faye, CometD) or a Centrifuge node: deliveries/s, latency, losses, server CPU and memory.",
        discussion: """
            Scenarios:
              fanout   --subscribers N on one channel; --publishers publish at --rate publishes/s, or (rate 0)
                       as fast as a --window of publishes in flight allows.
              rooms    CometD's chat shape: --subscribers clients, --rooms R, --rooms-per-client K; publishers
                       send --batch messages per frame to the rooms.
              idle     --subscribers connections handshaken, subscribed and held for --duration; with
                       --server-pid, reports the server's RSS per connection; one publish checks they all live.
              publish  HTTP publish ingest: publishers POST publishes without a handshake (as a Rails app does).
            Latency is measured from the scheduled publish time to receipt (both in this process). Every expected
            delivery is counted; losses are reported. With --server-pid (same machine), the server's CPU seconds
            per million deliveries and its RSS are read from /proc. Use only against servers you run.

            Past one process's descriptor limit: --workers N runs N child processes that hold the subscribers (each
            raises its soft RLIMIT_NOFILE to the hard limit), bound to loopback source addresses 127.0.0.2, .3, …
            (--per-address connections each) when the server is on loopback; this process publishes at --rate and
            merges their counts and latency histograms into one report. --url repeated spreads clients over several
            brokers. When connections fail for a limit (descriptors, ephemeral ports, the server's 503, memory), the
            report says which.
            """
    )

    @Option(
        help:
            "Endpoint, e.g. http://127.0.0.1:9292/faye (with --protocol centrifuge ws://127.0.0.1:8000/connection/websocket); repeat it to spread clients over several brokers."
    )
    var url: [String] = []
    @Option(help: "fanout, rooms, idle or publish.") var scenario: String = "fanout"
    @Option(help: "websocket or long-polling (default: long-polling for publish, websocket otherwise).")
    var transport: String?
    @Option(
        help:
            "bayeux, or centrifuge: Centrifuge's JSON protocol over WebSocket (a Centrifuge node, the library under Centrifugo)."
    )
    var `protocol`: String = "bayeux"
    @Option(help: "Subscribers (fanout), clients (rooms), connections (idle), listeners (publish; default 0).")
    var subscribers: Int?
    @Option(help: "Publishing connections.") var publishers: Int?
    @Option(help: "Rooms (rooms scenario).") var rooms: Int = 100
    @Option(help: "Rooms each client joins (rooms scenario).") var roomsPerClient: Int = 10
    @Option(help: "Bytes of each message's data.") var size: Int = 64
    @Option(help: "Publishes per second over all publishers; 0 for as fast as the window allows.") var rate: Double = 0
    @Option(help: "Publishes per frame or request.") var batch: Int = 1
    @Option(help: "Publishes in flight (unacknowledged or not yet received by all) when --rate is 0.")
    var window: Int = 16
    @Option(help: "Seconds to measure (idle: seconds to hold).") var duration: Double = 10
    @Option(help: "Publishes to measure, instead of --duration.") var messages: Int?
    @Option(help: "Seconds of load before measuring.") var warmup: Double = 2
    @Option(help: "Seconds to wait for outstanding deliveries at the end.") var drain: Double = 10
    @Option(help: "Event-loop threads of the load generator.") var threads: Int = 1
    @Option(help: "Connections opened at once.") var connectConcurrency: Int = 200
    @Option(help: "Seconds a connection may take to get ready.") var connectTimeout: Double = 60
    @Option(help: "PID of the server on this machine, for its CPU and memory.") var serverPid: Int32?
    @Option(help: "A name for the server in the report (e.g. faye-1.4.0).") var label: String?
    @Flag(help: "Print the report as JSON on standard output.") var json = false
    @Flag(help: "No progress line on standard error.") var quiet = false
    @Option(help: "Worker processes holding the subscribers (fanout at a --rate), each under its own descriptor limit.")
    var workers: Int = 0
    @Option(
        help: "Local address to bind before connecting; repeat it (default with --workers on loopback: 127.0.0.2, …).")
    var sourceAddress: [String] = []
    @Option(help: "Connections per source address.") var perAddress: Int = 3000
    @Flag(
        help:
            "WebSocket clients offer permessage-deflate and inflate compressed messages (also PUBSUB_BENCH_COMPRESSION=1)."
    )
    var compression = false
    @Option(
        help:
            "What each publish carries: filler (--size bytes), job-progress (~1 KiB JSON) or change-doc (~4 KiB JSON).")
    var payload: String?
    @Flag(help: .hidden) var worker = false
    @Option(help: .hidden) var runId: String?
    @Option(help: .hidden) var firstIndex: Int = 0

    func options() throws -> BenchOptions {
        let urls = try (url.isEmpty ? ["http://127.0.0.1:9292/faye"] : url).map { text in
            guard let url = BenchURL(text) else {
                throw ValidationError("--url must look like http://127.0.0.1:9292/faye")
            }
            return url
        }
        for address in sourceAddress where (try? SocketAddress(ipAddress: address, port: 0)) == nil {
            throw ValidationError("--source-address must be an IP address, not \(address)")
        }
        guard let scenario = Scenario(rawValue: scenario) else {
            throw ValidationError("--scenario must be fanout, rooms, idle or publish")
        }
        let transport: Transport
        if let name = self.transport {
            guard let t = Transport(rawValue: name) else {
                throw ValidationError("--transport must be websocket or long-polling")
            }
            transport = t
        } else {
            transport = scenario == .publish ? .longPolling : .websocket
        }
        let defaultSubscribers: Int
        switch scenario {
        case .fanout: defaultSubscribers = 100
        case .rooms: defaultSubscribers = 1000
        case .idle: defaultSubscribers = 1000
        case .publish: defaultSubscribers = 0
        }
        var options = BenchOptions(
            url: urls[0], scenario: scenario, transport: transport,
            subscribers: subscribers ?? defaultSubscribers,
            publishers: publishers ?? (scenario == .rooms ? 10 : scenario == .publish ? 4 : 1),
            rooms: rooms, roomsPerClient: roomsPerClient, payloadBytes: size, rate: rate, batch: batch,
            window: window, duration: duration, messages: messages, warmup: warmup, drain: drain,
            threads: threads, connectConcurrency: connectConcurrency, connectTimeout: connectTimeout,
            serverPID: serverPid)
        options.moreURLs = Array(urls.dropFirst())
        options.sourceAddresses = sourceAddress
        options.perAddress = perAddress
        options.runId = runId
        options.firstIndex = firstIndex
        if compression { options.compression = true }
        guard let serverProtocol = ServerProtocol(rawValue: `protocol`) else {
            throw ValidationError("--protocol must be bayeux or centrifuge")
        }
        options.serverProtocol = serverProtocol
        if let payload {
            guard let kind = BenchPayload(rawValue: payload) else {
                throw ValidationError(
                    "--payload must be \(BenchPayload.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            options.payload = kind
        }
        if workers < 0 || workers > 256 { throw ValidationError("--workers must be between 0 and 256") }
        if workers > 0 {
            guard scenario == .fanout, rate > 0 else {
                throw ValidationError("--workers runs the fanout scenario at a --rate (publishes per second) above 0")
            }
            if serverPid != nil, urls.count > 1 {
                throw ValidationError("--server-pid measures one broker: give one --url")
            }
            // The sources are split between the workers later; here only the combination is checked.
            var check = options
            check.sourceAddresses = []
            if let problem = check.problem() { throw ValidationError(problem) }
            return options
        }
        if let problem = options.problem() { throw ValidationError(problem) }
        return options
    }

    func validate() throws { _ = try options() }

    func run() async throws {
        let options = try options()
        let descriptors = raiseDescriptorLimit()
        if worker {
            try await runAsWorker(options)
            return
        }
        let interactive = isatty(2) != 0
        let quiet = self.quiet
        var remote: ProcessWorkers?
        if workers > 0 {
            do {
                remote = try ProcessWorkers(
                    options: options, workers: workers, sourceAddresses: sourceAddress, perAddress: perAddress,
                    descriptorLimit: descriptors)
            } catch let error as BenchError {
                writeStandardError("pubsub bench: \(error)\n")
                throw ExitCode.failure
            }
        }
        var runOptions = options
        if let remote {
            runOptions.runId = remote.runId
            runOptions.sourceAddresses = []  // the workers' own; publishers connect from the system's choice
        }
        let runner = BenchRunner(options: runOptions, remote: remote) { line in
            guard !quiet else { return }
            if interactive {
                writeStandardError("\r\u{1B}[K" + line)
            } else {
                writeStandardError(line + "\n")
            }
        }
        var report: BenchReport
        do {
            report = try await runner.run()
        } catch {
            remote?.terminate()
            if interactive, !quiet { writeStandardError("\n") }
            writeStandardError("pubsub bench: \(error)\n")
            throw ExitCode.failure
        }
        remote?.terminate()
        if interactive, !quiet { writeStandardError("\r\u{1B}[K") }
        report.serverName = label
        print(json ? report.jsonText : report.table)
        if report.lost > 0 || report.connectFailures > 0 { throw ExitCode(2) }
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the limit in force.
private func raiseDescriptorLimit() -> Int {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
    if limit.rlim_cur < limit.rlim_max {
        var raised = limit
        raised.rlim_cur = limit.rlim_max
        if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
    }
    return limit.rlim_cur > rlim_t(Int32.max) ? Int(Int32.max) : Int(limit.rlim_cur)
}

func writeStandardError(_ text: String) {
    _ = text.utf8.withContiguousStorageIfAvailable { write(2, $0.baseAddress, $0.count) }
}
