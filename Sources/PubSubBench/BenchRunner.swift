import Atomics
import NIOCore
import NIOPosix

/// Runs one scenario against one server: connects the clients, warms up, measures, drains, and reports.
///
/// Clients are spread over the generator's event loops; each loop counts into its own `LoopStats` and is read
/// with `submit`, so nothing on the receive path takes a lock. Every phase is bounded in time.
public final class BenchRunner: Sendable {
    public let options: BenchOptions
    /// Called about once a second with a one-line status.
    private let progress: @Sendable (String) -> Void
    /// Subscribers held by other processes (`--workers`): this runner then only publishes.
    private let remote: (any BenchRemoteSubscribers)?

    public init(
        options: BenchOptions, remote: (any BenchRemoteSubscribers)? = nil,
        progress: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.options = options
        self.remote = remote
        self.progress = progress
    }

    public func run() async throws -> BenchReport {
        if let problem = options.problem() { throw BenchError(problem) }
        if let pid = options.serverPID, !ProcessSampler.exists(pid) {
            throw BenchError("no process \(pid) on this machine (--server-pid)")
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: options.threads)
        do {
            let report = try await run(on: group)
            try? await group.shutdownGracefully()
            return report
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }

    private func run(on group: MultiThreadedEventLoopGroup) async throws -> BenchReport {
        let o = options
        let loops = Array(group.makeIterator())
        let stats = loops.map { _ in LoopStats() }
        let runId = o.runId ?? String(UInt32.random(in: 0...UInt32.max), radix: 36)
        let shared = RunShared(options: o, runId: runId)
        let baseline = o.serverPID.flatMap { ProcessSampler.sample($0) }
        let setupStart = monotonicNanoseconds()

        // Subscribers, then publishers.
        let localSubscribers = remote == nil ? o.subscribers : 0
        let subscribers = (0..<localSubscribers).map { i in
            BenchClient(
                role: .subscriber(slot: i), shared: shared, stats: stats[i % loops.count], loop: loops[i % loops.count],
                index: i)
        }
        let subscribed = await connectAll(subscribers, label: "subscribers")
        let remoteReady = try await remote?.connect()
        let publisherCount = o.scenario == .idle ? 1 : o.publishers
        let publishers = (0..<publisherCount).map { i in
            BenchClient(
                role: .publisher(index: i), shared: shared, stats: stats[(o.subscribers + i) % loops.count],
                loop: loops[(o.subscribers + i) % loops.count], index: localSubscribers + i)
        }
        let published = await connectAll(publishers, label: "publishers")
        let setupSeconds = Double(monotonicNanoseconds() - setupStart) / 1e9
        let readyPublishers = zip(publishers, published).filter(\.1).map(\.0)

        var fanout = Array(repeating: 0, count: shared.channels.count)
        for (slot, ok) in subscribed.enumerated() where ok {
            for c in shared.memberships[slot] { fanout[c] += 1 }
        }
        if let remoteReady { fanout[0] += remoteReady.ready }
        let totalFanout = fanout.reduce(0, +)
        let averageFanout = max(1, totalFanout / max(1, shared.channels.count))

        // The measured window.
        let now = monotonicNanoseconds()
        let windowStart = o.scenario == .idle ? now : now + UInt64(o.warmup * 1e9)
        let windowEnd: UInt64 =
            o.messages != nil ? .max : windowStart + UInt64(o.duration * 1e9)
        for (loop, s) in zip(loops, stats) {
            try await loop.submit {
                s.windowStart = windowStart
                s.windowEnd = o.scenario == .idle ? .max : windowEnd
            }.get()
        }
        try await remote?.startWindow(start: windowStart, end: windowEnd)

        var serverStart: ProcessSample?
        var benchStart: ProcessSample?
        var serverEnd: ProcessSample?
        var benchEnd: ProcessSample?
        var serverPeakRSS = 0
        var publishersDone = false

        if o.scenario == .idle {
            serverStart = o.serverPID.flatMap { ProcessSampler.sample($0) }
            benchStart = ProcessSampler.sample(nil)
            let holdEnd = now + UInt64(o.duration * 1e9)
            while monotonicNanoseconds() < holdEnd {
                try await sleep(until: min(holdEnd, monotonicNanoseconds() + 1_000_000_000))
                let s = await snapshot(loops, stats)
                var line =
                    "[idle] holding \(s.connected) connections, \(format(Double(holdEnd &- min(holdEnd, monotonicNanoseconds())) / 1e9, 0)) s left, errors \(s.errors)"
                if let pid = o.serverPID, let sample = ProcessSampler.sample(pid) {
                    line += ", server RSS \(formatBytes(sample.rssBytes))"
                    serverPeakRSS = max(serverPeakRSS, sample.rssBytes)
                }
                progress(line)
            }
            serverEnd = o.serverPID.flatMap { ProcessSampler.sample($0) }
            benchEnd = ProcessSampler.sample(nil)
            // Liveness: one publish that every held connection must receive.
            if let probe = readyPublishers.first {
                let count = fanout[0]
                try await probe.loop.submit { probe.publishOnce(fanout: count) }.get()
            }
            publishersDone = true
        } else {
            let plan = PublishPlan(
                fanout: fanout, windowStart: windowStart, windowEnd: windowEnd,
                rate: o.rate / Double(max(1, readyPublishers.count)),
                budget: nil,
                windowDeliveries: max(o.batch, o.window) * averageFanout,
                windowAcks: max(o.batch, o.window / max(1, readyPublishers.count)))
            shared.wakeThreshold.store(plan.windowDeliveries / 2, ordering: .relaxed)
            var done: [EventLoopFuture<Void>] = []
            for (i, publisher) in readyPublishers.enumerated() {
                var mine = plan
                if let messages = o.messages {
                    let share = messages / readyPublishers.count + (i < messages % readyPublishers.count ? 1 : 0)
                    mine.budget = share
                }
                let p = mine
                done.append(try await publisher.loop.submit { publisher.startPublishing(p) }.get())
            }
            let allDone = EventLoopFuture.andAllComplete(done, on: loops[0])
            let finished = ManagedAtomic<Bool>(false)
            allDone.whenComplete { _ in finished.store(true, ordering: .releasing) }

            try await sleep(until: windowStart)
            serverStart = o.serverPID.flatMap { ProcessSampler.sample($0) }
            benchStart = ProcessSampler.sample(nil)
            var last = await snapshot(loops, stats)
            var lastAt = monotonicNanoseconds()
            let hardStop = windowStart + UInt64((o.messages != nil ? 3600 : o.duration + 1) * 1e9)
            while true {
                let nowNs = monotonicNanoseconds()
                if o.messages == nil, nowNs >= windowEnd { break }
                if o.messages != nil, finished.load(ordering: .acquiring) { break }
                if nowNs >= hardStop { break }
                let target = o.messages == nil ? min(windowEnd, nowNs + 1_000_000_000) : nowNs + 250_000_000
                try await sleep(until: target)
                let current = monotonicNanoseconds()
                if o.messages != nil, current - lastAt < 1_000_000_000, !finished.load(ordering: .acquiring) {
                    continue
                }
                let s = await snapshot(loops, stats)
                let seconds = Double(current - lastAt) / 1e9
                var line =
                    "[\(o.scenario.rawValue)] \(format(Double(current - windowStart) / 1e9, 0)) s: \(formatCount(Double(s.deliveries - last.deliveries) / seconds)) deliveries/s, \(formatCount(Double(s.publishesSent - last.publishesSent) / seconds)) publishes/s, p99 \(format(Double(s.latencyP99) / 1000)) ms, outstanding \(shared.outstanding), errors \(s.errors)"
                if remote != nil {
                    // Deliveries are counted by the workers and merged at the end.
                    line =
                        "[\(o.scenario.rawValue)] \(format(Double(current - windowStart) / 1e9, 0)) s: \(formatCount(Double(s.publishesSent - last.publishesSent) / seconds)) publishes/s to \(fanout[0]) subscribers in worker processes, errors \(s.errors)"
                }
                if let pid = o.serverPID, let sample = ProcessSampler.sample(pid) {
                    line += ", server RSS \(formatBytes(sample.rssBytes))"
                    serverPeakRSS = max(serverPeakRSS, sample.rssBytes)
                }
                progress(line)
                last = s
                lastAt = current
            }
            if o.messages == nil {
                serverEnd = o.serverPID.flatMap { ProcessSampler.sample($0) }
                benchEnd = ProcessSampler.sample(nil)
            }
            publishersDone = true
        }

        // Drain: wait for every expected delivery and acknowledgement, within a bound.
        let drainEnd = monotonicNanoseconds() + UInt64(o.drain * 1e9)
        while monotonicNanoseconds() < drainEnd {
            let s = await snapshot(loops, stats)
            let acksPending = s.publishesSent - s.acks - s.publishFailures
            if remote != nil, acksPending <= 0 { break }
            if shared.outstanding <= 0, acksPending <= 0 { break }
            try await sleep(until: monotonicNanoseconds() + 20_000_000)
        }
        var workerReports: [WorkerReport] = []
        if let remote {
            // The workers wait for every delivery of the publishes that succeeded, within what is left of the drain.
            let s = await snapshot(loops, stats)
            workerReports = try await remote.finish(
                publishes: s.publishesSent - s.publishFailures,
                deadline: max(drainEnd, monotonicNanoseconds() + 1_000_000_000))
        }
        let workers = WorkerReport.combine(workerReports)
        if o.messages != nil {
            serverEnd = o.serverPID.flatMap { ProcessSampler.sample($0) }
            benchEnd = ProcessSampler.sample(nil)
        }
        _ = publishersDone

        // Collect, then close.
        let total = try await merged(loops, stats)
        if remote != nil { total.merge(workers) }
        for client in subscribers + publishers {
            client.loop.execute { client.close() }
        }

        // Rates over the window.
        let measuredNs: UInt64
        if o.scenario == .idle {
            measuredNs = UInt64(o.duration * 1e9)
        } else if o.messages != nil {
            let end = max(total.lastDelivery, benchEnd?.at ?? windowStart)
            measuredNs = max(1, end &- windowStart)
        } else {
            measuredNs = windowEnd - windowStart
        }
        let measured = Double(measuredNs) / 1e9
        let deliveries = o.scenario == .idle ? 0 : total.deliveriesInWindow
        let publishes = o.scenario == .idle ? 0 : total.publishesInWindow

        func usage(_ start: ProcessSample?, _ end: ProcessSample?) -> ProcessUsage? {
            guard let start, let end else { return nil }
            let cpu = end.cpuSeconds - start.cpuSeconds
            let wall = Double(end.at - start.at) / 1e9
            let work = deliveries > 0 ? deliveries : publishes
            return ProcessUsage(
                cpuSeconds: cpu, cores: wall > 0 ? cpu / wall : 0,
                cpuSecondsPerMillion: work > 0 ? cpu / Double(work) * 1e6 : nil,
                rssBytes: max(end.rssBytes, serverPeakRSS))
        }
        var server = usage(serverStart, serverEnd)
        if server != nil, o.scenario != .idle { server!.rssBytes = max(server!.rssBytes, serverPeakRSS) }
        var bench = usage(benchStart, benchEnd)
        if bench != nil { bench!.rssBytes = benchEnd?.rssBytes ?? 0 }
        if remote != nil, var b = bench {
            // The workers' CPU over the same window and their memory, beside this process's.
            let wall = Double((benchEnd?.at ?? 0) &- (benchStart?.at ?? 0)) / 1e9
            b.cpuSeconds += workers.cpuSeconds
            b.cores = wall > 0 ? b.cpuSeconds / wall : 0
            let work = deliveries > 0 ? deliveries : publishes
            b.cpuSecondsPerMillion = work > 0 ? b.cpuSeconds / Double(work) * 1e6 : nil
            b.rssBytes += workers.rssBytes
            bench = b
        }
        let limit = remote != nil ? (remoteReady?.limit ?? workers.limit) : total.limit
        var perConnection: Double?
        if o.scenario == .idle, let baseline, let end = serverEnd, total.connected > 0 {
            perConnection = Double(end.rssBytes - baseline.rssBytes) / Double(subscribed.filter { $0 }.count)
            server?.rssBytes = end.rssBytes
        }

        var report = BenchReport(
            options: o, serverName: nil, connected: total.connected, connectFailures: total.connectFailures,
            connectTime: LatencySummary(total.connectTime), setupSeconds: setupSeconds, measuredSeconds: measured,
            publishes: publishes, publishesPerSecond: Double(publishes) / measured,
            deliveries: deliveries, deliveriesPerSecond: Double(deliveries) / measured,
            latency: LatencySummary(total.latency), ackLatency: LatencySummary(total.ackLatency),
            expectedDeliveries: shared.expected.load(ordering: .relaxed), receivedDeliveries: total.deliveries,
            outOfOrder: total.duplicates, errors: total.errors + total.publishFailures,
            errorSamples: total.errorSamples, server: server, serverBaselineRSS: baseline?.rssBytes,
            serverRSSPerConnection: perConnection, bench: bench, limit: limit, workers: workerReports.count)
        report.subscriberWireBytes = total.subscriberWireBytesInWindow
        report.compressionNegotiated = total.compressionNegotiated
        report.compressionSample = total.sample
        return report
    }

    /// Opens clients, at most `connectConcurrency` at once; returns which became ready.
    func connectAll(_ clients: [BenchClient], label: String) async -> [Bool] {
        guard !clients.isEmpty else { return [] }
        var ready = Array(repeating: false, count: clients.count)
        let limit = options.connectConcurrency
        var lastPrint = monotonicNanoseconds()
        var completed = 0
        var failed = 0
        await withTaskGroup(of: (Int, Bool).self) { group in
            var next = 0
            func launch(_ i: Int) {
                let client = clients[i]
                group.addTask {
                    do {
                        try await client.loop.submit { client.start() }.get()
                        try await client.ready.futureResult.get()
                        return (i, true)
                    } catch {
                        return (i, false)
                    }
                }
            }
            while next < min(limit, clients.count) {
                launch(next)
                next += 1
            }
            for await (i, ok) in group {
                ready[i] = ok
                completed += 1
                if !ok { failed += 1 }
                if next < clients.count {
                    launch(next)
                    next += 1
                }
                let now = monotonicNanoseconds()
                if now - lastPrint >= 1_000_000_000 {
                    lastPrint = now
                    progress(
                        "[\(options.scenario.rawValue)] connecting \(label): \(completed)/\(clients.count) ready, \(failed) failed"
                    )
                }
            }
        }
        return ready
    }

    private func snapshot(_ loops: [any EventLoop], _ stats: [LoopStats]) async -> LoopStats.Snapshot {
        var total = LoopStats.Snapshot.zero
        for (loop, s) in zip(loops, stats) {
            if let snap = try? await loop.submit({ s.snapshot }).get() { total = total + snap }
        }
        return total
    }

    private func sleep(until deadline: UInt64) async throws {
        let now = monotonicNanoseconds()
        if deadline > now { try await Task.sleep(nanoseconds: deadline - now) }
    }
}
