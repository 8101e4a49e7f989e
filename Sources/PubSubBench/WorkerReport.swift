import Bayeux
import Histogram

/// What stopped connections from opening, named from the errors the clients met.
public enum BenchLimit: String, Sendable, Equatable, CaseIterable {
    /// The load generator's descriptor limit (EMFILE/ENFILE).
    case descriptors
    /// No local port left for a source address (EADDRNOTAVAIL on connect or bind).
    case ephemeralPorts = "ephemeral-ports"
    /// The server refused the connection with HTTP 503 (its `--max-connections` or descriptor ceiling).
    case server503 = "server-503"
    /// Out of memory (ENOMEM/ENOBUFS).
    case memory
    /// The server did not accept at all (ECONNREFUSED, a listen backlog that overflowed and timed out).
    case refused

    /// The sentence a report prints for it.
    public var sentence: String {
        switch self {
        case .descriptors: "the load generator's descriptor limit (EMFILE): add --workers"
        case .ephemeralPorts:
            "ephemeral ports of a source address ran out (EADDRNOTAVAIL): lower --per-address or add addresses"
        case .server503: "the server refused connections with HTTP 503 (its connection or descriptor limit)"
        case .memory: "memory (ENOMEM/ENOBUFS)"
        case .refused: "the server refused or did not accept connections (ECONNREFUSED or connect timeout)"
        }
    }

    /// The limit an error text points to, or nil for an error that is no limit.
    public static func classify(_ error: String) -> BenchLimit? {
        let text = error.lowercased()
        if text.contains("too many open files") || text.contains("emfile") || text.contains("enfile") {
            return .descriptors
        }
        if text.contains("cannot assign requested address") || text.contains("eaddrnotavail")
            || text.contains("address not available")
        {
            return .ephemeralPorts
        }
        if text.contains("http 503") { return .server503 }
        if text.contains("cannot allocate memory") || text.contains("enomem") || text.contains("no buffer space") {
            return .memory
        }
        if text.contains("connection refused") || text.contains("econnrefused") || text.contains("connect timeout")
            || text.contains("not ready within")
        {
            return .refused
        }
        return nil
    }
}

/// One worker process's part of a multi-process run, as it sends it to the coordinating `pubsub bench` on one
/// line of JSON. Histograms travel as their recorded (value, count) pairs, which decode into the same buckets, so
/// merged percentiles are those of one histogram that had recorded everything.
public struct WorkerReport: Sendable {
    public var ready: Int
    public var failed: Int
    public var deliveries: Int
    public var deliveriesInWindow: Int
    public var outOfOrder: Int
    public var gaps: Int
    public var errors: Int
    public var errorSamples: [String]
    /// What stopped connections, when some failed for a known limit.
    public var limit: BenchLimit?
    public var latency: Histogram<UInt64>
    public var connectTime: Histogram<UInt64>
    /// The worker's own CPU seconds over the measured window and its RSS at the end.
    public var cpuSeconds: Double
    public var rssBytes: Int
    /// Bytes the worker's subscribers read from their sockets in the window, the WebSockets that negotiated
    /// permessage-deflate, and the worker's sample of event frames.
    public var subscriberWireBytesInWindow = 0
    public var compressionNegotiated = 0
    public var sample = CompressionSample()

    public init(
        ready: Int = 0, failed: Int = 0, deliveries: Int = 0, deliveriesInWindow: Int = 0, outOfOrder: Int = 0,
        gaps: Int = 0, errors: Int = 0, errorSamples: [String] = [], limit: BenchLimit? = nil,
        latency: Histogram<UInt64>? = nil, connectTime: Histogram<UInt64>? = nil,
        cpuSeconds: Double = 0, rssBytes: Int = 0
    ) {
        self.ready = ready
        self.failed = failed
        self.deliveries = deliveries
        self.deliveriesInWindow = deliveriesInWindow
        self.outOfOrder = outOfOrder
        self.gaps = gaps
        self.errors = errors
        self.errorSamples = errorSamples
        self.limit = limit
        self.latency = latency ?? LoopStats.makeHistogram()
        self.connectTime = connectTime ?? LoopStats.makeHistogram()
        self.cpuSeconds = cpuSeconds
        self.rssBytes = rssBytes
    }

    init(_ stats: LoopStats, cpuSeconds: Double, rssBytes: Int) {
        self.init(
            ready: stats.connected, failed: stats.connectFailures, deliveries: stats.deliveries,
            deliveriesInWindow: stats.deliveriesInWindow, outOfOrder: stats.duplicates, gaps: stats.gaps,
            errors: stats.errors, errorSamples: stats.errorSamples,
            limit: stats.limit,
            latency: stats.latency, connectTime: stats.connectTime, cpuSeconds: cpuSeconds, rssBytes: rssBytes)
        subscriberWireBytesInWindow = stats.subscriberWireBytesInWindow
        compressionNegotiated = stats.compressionNegotiated
        sample = stats.sample
    }

    /// Everything the workers measured, as if one process had: counts add up, histograms merge exactly, the
    /// first limit met is kept.
    public static func combine(_ reports: [WorkerReport]) -> WorkerReport {
        var total = WorkerReport()
        for r in reports {
            total.ready += r.ready
            total.failed += r.failed
            total.deliveries += r.deliveries
            total.deliveriesInWindow += r.deliveriesInWindow
            total.outOfOrder += r.outOfOrder
            total.gaps += r.gaps
            total.errors += r.errors
            for sample in r.errorSamples where total.errorSamples.count < 8 && !total.errorSamples.contains(sample) {
                total.errorSamples.append(sample)
            }
            total.limit = total.limit ?? r.limit
            total.latency.add(r.latency)
            total.connectTime.add(r.connectTime)
            total.cpuSeconds += r.cpuSeconds
            total.rssBytes += r.rssBytes
            total.subscriberWireBytesInWindow += r.subscriberWireBytesInWindow
            total.compressionNegotiated += r.compressionNegotiated
            total.sample.add(r.sample)
        }
        return total
    }

    // MARK: The line between processes

    public var json: JSONValue {
        var o: JSONObject = [
            "ready": JSONValue(ready), "failed": JSONValue(failed), "deliveries": JSONValue(deliveries),
            "deliveries_in_window": JSONValue(deliveriesInWindow), "out_of_order": JSONValue(outOfOrder),
            "gaps": JSONValue(gaps), "errors": JSONValue(errors),
            "error_samples": .array(errorSamples.map(JSONValue.string)),
            "latency": Self.encode(latency), "connect_time": Self.encode(connectTime),
            "cpu_seconds": .number(String(cpuSeconds)), "rss_bytes": JSONValue(rssBytes),
            "wire_bytes_in_window": JSONValue(subscriberWireBytesInWindow),
            "compression_negotiated": JSONValue(compressionNegotiated),
            "sample": .array(
                [sample.frames, sample.events, sample.wireBytes, sample.plainBytes, sample.zlibBytes].map {
                    JSONValue($0)
                }),
        ]
        if let limit { o["limit"] = .string(limit.rawValue) }
        return .object(o)
    }

    public init?(json: JSONValue) {
        guard case .object(let o) = json else { return nil }
        func int(_ key: String) -> Int? { o[key]?.integerValue.map { Int($0) } }
        guard let ready = int("ready"), let failed = int("failed"), let deliveries = int("deliveries"),
            let inWindow = int("deliveries_in_window"), let latency = o["latency"].flatMap(Self.decode),
            let connectTime = o["connect_time"].flatMap(Self.decode)
        else { return nil }
        var cpu = 0.0
        if case .number(let text)? = o["cpu_seconds"] { cpu = Double(text) ?? 0 }
        self.init(
            ready: ready, failed: failed, deliveries: deliveries, deliveriesInWindow: inWindow,
            outOfOrder: int("out_of_order") ?? 0, gaps: int("gaps") ?? 0, errors: int("errors") ?? 0,
            errorSamples: o["error_samples"]?.arrayValue?.compactMap(\.stringValue) ?? [],
            limit: o["limit"]?.stringValue.flatMap(BenchLimit.init(rawValue:)),
            latency: latency, connectTime: connectTime, cpuSeconds: cpu, rssBytes: int("rss_bytes") ?? 0)
        subscriberWireBytesInWindow = int("wire_bytes_in_window") ?? 0
        compressionNegotiated = int("compression_negotiated") ?? 0
        if let s = o["sample"]?.arrayValue?.compactMap({ $0.integerValue.map { Int($0) } }), s.count == 5 {
            sample = CompressionSample(frames: s[0], events: s[1], wireBytes: s[2], plainBytes: s[3], zlibBytes: s[4])
        }
    }

    /// `[[value, count], …]` over the recorded buckets. The lowest and highest buckets carry the exact minimum and
    /// maximum recorded (percentiles are clamped to them), so the decoded histogram answers every query alike.
    static func encode(_ histogram: Histogram<UInt64>) -> JSONValue {
        var buckets: [(value: UInt64, count: UInt64)] = histogram.recordedValues().map { ($0.value, UInt64($0.count)) }
        if let first = buckets.first {
            if buckets.count == 1 {
                let one: UInt64 = 1
                buckets =
                    first.count >= 2
                    ? [(histogram.min, one), (histogram.maxRecorded, first.count - one)]
                    : [(histogram.maxRecorded, one)]
            } else {
                buckets[0].value = histogram.min
                buckets[buckets.count - 1].value = histogram.maxRecorded
            }
        }
        return .array(buckets.map { .array([.number(String($0.value)), .number(String($0.count))]) })
    }

    static func decode(_ value: JSONValue) -> Histogram<UInt64>? {
        guard let pairs = value.arrayValue else { return nil }
        var histogram = LoopStats.makeHistogram()
        for pair in pairs {
            guard let two = pair.arrayValue, two.count == 2, let v = two[0].integerValue, let c = two[1].integerValue,
                v >= 0, c >= 0
            else { return nil }
            guard c == 0 || histogram.record(UInt64(v), count: UInt64(c)) else { return nil }
        }
        return histogram
    }
}

/// A worker's status line before the load starts: how many of its subscribers are ready.
public struct WorkerReady: Sendable, Equatable {
    public var ready: Int
    public var failed: Int
    public var limit: BenchLimit?
    public var errorSamples: [String]

    public init(ready: Int, failed: Int, limit: BenchLimit? = nil, errorSamples: [String] = []) {
        self.ready = ready
        self.failed = failed
        self.limit = limit
        self.errorSamples = errorSamples
    }

    public var json: JSONValue {
        var o: JSONObject = [
            "ready": JSONValue(ready), "failed": JSONValue(failed),
            "error_samples": .array(errorSamples.map(JSONValue.string)),
        ]
        if let limit { o["limit"] = .string(limit.rawValue) }
        return .object(o)
    }

    public init?(json: JSONValue) {
        guard case .object(let o) = json, let ready = o["ready"]?.integerValue, let failed = o["failed"]?.integerValue
        else { return nil }
        self.init(
            ready: Int(ready), failed: Int(failed), limit: o["limit"]?.stringValue.flatMap(BenchLimit.init(rawValue:)),
            errorSamples: o["error_samples"]?.arrayValue?.compactMap(\.stringValue) ?? [])
    }
}

/// How `pubsub bench --workers N` splits its connections: each worker's share and its own source addresses, so
/// that no address carries more than `perAddress` connections and no worker more than its descriptors allow.
public struct WorkerPlan: Sendable, Equatable {
    public struct Share: Sendable, Equatable {
        public var subscribers: Int
        public var sourceAddresses: [String]
    }

    public var shares: [Share]

    /// - Parameters:
    ///   - addresses: the source addresses to spread over, in order; empty means the system chooses (one address).
    ///   - descriptorLimit: the hard descriptor limit one worker may raise itself to.
    /// - Throws: a `BenchError` that names the limit a plan would break.
    public init(subscribers: Int, workers: Int, addresses: [String], perAddress: Int, descriptorLimit: Int) throws {
        guard workers >= 1 else { throw BenchError("--workers must be at least 1") }
        let each = (subscribers + workers - 1) / workers
        // Descriptors a worker needs beside its sockets: stdio, the event loops' epoll and wake-up fds, slack.
        let reserve = 64
        if each + reserve > descriptorLimit {
            let needed = (subscribers + (descriptorLimit - reserve) - 1) / max(1, descriptorLimit - reserve)
            throw BenchError(
                "each of \(workers) workers would hold \(each) connections, above the descriptor limit of \(descriptorLimit) per process: use --workers \(needed) or more"
            )
        }
        if !addresses.isEmpty {
            let capacity = addresses.count * perAddress
            if capacity < subscribers {
                throw BenchError(
                    "\(addresses.count) source addresses at \(perAddress) connections each hold \(capacity), fewer than \(subscribers): add addresses or raise --per-address"
                )
            }
        }
        var shares: [Share] = []
        var next = 0
        for w in 0..<workers {
            let count = subscribers / workers + (w < subscribers % workers ? 1 : 0)
            var mine: [String] = []
            if !addresses.isEmpty {
                let needed = max(1, (count + perAddress - 1) / perAddress)
                mine = Array(addresses[next..<min(addresses.count, next + needed)])
                next += needed
            }
            shares.append(Share(subscribers: count, sourceAddresses: mine))
        }
        self.shares = shares
    }

    /// `127.0.0.2`, `127.0.0.3`, … : `count` loopback addresses (Linux routes all of 127/8 to `lo`).
    public static func loopbackAddresses(count: Int, from first: Int = 2) -> [String] {
        (0..<count).map { i in
            let n = first + i
            return "127.0.\(n / 256).\(n % 256)"
        }
    }
}
