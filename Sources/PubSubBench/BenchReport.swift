import Bayeux
import Histogram

/// Percentiles of a latency histogram, in milliseconds.
public struct LatencySummary: Sendable, Equatable {
    public var count: UInt64
    public var p50: Double
    public var p90: Double
    public var p99: Double
    public var p999: Double
    public var max: Double

    init(_ histogram: Histogram<UInt64>) {
        count = histogram.totalCount
        func ms(_ micros: UInt64) -> Double { Double(micros) / 1000 }
        if count == 0 {
            p50 = 0
            p90 = 0
            p99 = 0
            p999 = 0
            max = 0
        } else {
            p50 = ms(histogram.valueAtPercentile(50))
            p90 = ms(histogram.valueAtPercentile(90))
            p99 = ms(histogram.valueAtPercentile(99))
            p999 = ms(histogram.valueAtPercentile(99.9))
            max = ms(histogram.max)
        }
    }

    var json: JSONValue {
        .object([
            "count": .number(String(count)), "p50_ms": number(p50), "p90_ms": number(p90), "p99_ms": number(p99),
            "p99_9_ms": number(p999), "max_ms": number(max),
        ])
    }
}

/// CPU and memory of one process over the measured window.
public struct ProcessUsage: Sendable, Equatable {
    public var cpuSeconds: Double
    /// CPU seconds per wall second (1.0 = one core busy).
    public var cores: Double
    /// CPU seconds per million deliveries (per million publishes when nothing is delivered).
    public var cpuSecondsPerMillion: Double?
    public var rssBytes: Int

    var json: JSONValue {
        var o: JSONObject = [
            "cpu_seconds": number(cpuSeconds), "cpu_cores": number(cores), "rss_bytes": .number(String(rssBytes)),
        ]
        if let cpuSecondsPerMillion { o["cpu_seconds_per_million"] = number(cpuSecondsPerMillion) }
        return .object(o)
    }
}

public struct BenchReport: Sendable {
    public var options: BenchOptions
    public var serverName: String?
    /// Connections that were handshaken and subscribed (publishers included), and those that failed.
    public var connected: Int
    public var connectFailures: Int
    public var connectTime: LatencySummary
    public var setupSeconds: Double
    /// The measured window, seconds.
    public var measuredSeconds: Double
    public var publishes: Int
    public var publishesPerSecond: Double
    public var deliveries: Int
    public var deliveriesPerSecond: Double
    public var latency: LatencySummary
    public var ackLatency: LatencySummary
    /// Every delivery expected over the run (warm-up included) and what arrived.
    public var expectedDeliveries: Int
    public var receivedDeliveries: Int
    public var lost: Int { max(0, expectedDeliveries - receivedDeliveries) }
    public var extra: Int { max(0, receivedDeliveries - expectedDeliveries) }
    public var outOfOrder: Int
    public var errors: Int
    public var errorSamples: [String]
    public var server: ProcessUsage?
    /// Server RSS before the clients connected; with `server`, the idle memory per connection.
    public var serverBaselineRSS: Int?
    public var serverRSSPerConnection: Double?
    public var bench: ProcessUsage?
    /// What stopped connections from opening, when some failed for a known limit.
    public var limit: BenchLimit?
    /// Worker processes that held the subscribers (0: this process did).
    public var workers: Int = 0
    /// Bytes read from the subscribers' WebSockets while the window was open (frames and their headers).
    public var subscriberWireBytes: Int = 0
    /// WebSockets (subscribers and publishers) whose upgrade accepted permessage-deflate.
    public var compressionNegotiated: Int = 0
    /// The subscribers' sample of event frames: on the wire, plain, and compressed by zlib alone.
    public var compressionSample = CompressionSample()

    /// Bytes on the wire per delivered event (WebSocket subscribers, over the window): what the sockets handed
    /// over, replies and frame headers included, divided by the deliveries.
    public var wireBytesPerDelivery: Double? {
        guard options.transport == .websocket, options.scenario != .idle, deliveries > 0 else { return nil }
        return Double(subscriberWireBytes) / Double(deliveries)
    }

    /// Per event of the sample: bytes on the wire, as plain frames, and compressed by zlib alone.
    public var samplePerEvent: (wire: Double, plain: Double, zlib: Double)? {
        let s = compressionSample
        guard s.events > 0 else { return nil }
        let n = Double(s.events)
        return (Double(s.wireBytes) / n, Double(s.plainBytes) / n, Double(s.zlibBytes) / n)
    }

    /// Deliveries the load generator can take per CPU second of its own: its ceiling on one core.
    public var benchCeilingPerCore: Double? {
        guard let bench, bench.cpuSeconds > 0, deliveries > 0 else { return nil }
        return Double(deliveries) / bench.cpuSeconds
    }

    public var json: JSONValue {
        let o = options
        var config: JSONObject = [
            "url": .string(o.url.description), "scenario": .string(o.scenario.rawValue),
            "transport": .string(o.transport.rawValue), "subscribers": JSONValue(o.subscribers),
            "publishers": JSONValue(o.publishers), "payload_bytes": JSONValue(o.payloadBytes),
            "rate": number(o.rate), "batch": JSONValue(o.batch), "window": JSONValue(o.window),
            "warmup_seconds": number(o.warmup), "threads": JSONValue(o.threads),
            "payload": .string(o.payload.rawValue), "compression": .bool(o.compression),
            "protocol": .string(o.serverProtocol.rawValue),
        ]
        if o.scenario == .rooms {
            config["rooms"] = JSONValue(o.rooms)
            config["rooms_per_client"] = JSONValue(o.roomsPerClient)
        }
        if let m = o.messages {
            config["messages"] = JSONValue(m)
        } else {
            config["duration_seconds"] = number(o.duration)
        }
        var out: JSONObject = [
            "config": .object(config),
            "connected": JSONValue(connected), "connect_failures": JSONValue(connectFailures),
            "connect_time": connectTime.json, "setup_seconds": number(setupSeconds),
            "measured_seconds": number(measuredSeconds),
            "publishes": JSONValue(publishes), "publishes_per_second": number(publishesPerSecond),
            "deliveries": JSONValue(deliveries), "deliveries_per_second": number(deliveriesPerSecond),
            "latency": latency.json, "ack_latency": ackLatency.json,
            "expected_deliveries": JSONValue(expectedDeliveries), "received_deliveries": JSONValue(receivedDeliveries),
            "lost": JSONValue(lost), "extra": JSONValue(extra), "out_of_order": JSONValue(outOfOrder),
            "errors": JSONValue(errors), "error_samples": .array(errorSamples.map(JSONValue.string)),
        ]
        if let serverName { out["server_name"] = .string(serverName) }
        if let server { out["server"] = server.json }
        if let serverBaselineRSS { out["server_baseline_rss_bytes"] = JSONValue(serverBaselineRSS) }
        if let serverRSSPerConnection { out["server_rss_per_connection_bytes"] = number(serverRSSPerConnection) }
        if let bench { out["bench"] = bench.json }
        if let benchCeilingPerCore { out["bench_deliveries_per_cpu_second"] = number(benchCeilingPerCore) }
        if let limit {
            out["limit"] = .string(limit.rawValue)
            out["limit_reason"] = .string(limit.sentence)
        }
        if workers > 0 { out["workers"] = JSONValue(workers) }
        if o.transport == .websocket {
            var compression: JSONObject = [
                "offered": .bool(o.compression), "negotiated": JSONValue(compressionNegotiated),
            ]
            if let wireBytesPerDelivery {
                compression["subscriber_wire_bytes"] = JSONValue(subscriberWireBytes)
                out["wire_bytes_per_delivery"] = number(wireBytesPerDelivery)
            }
            if let per = samplePerEvent {
                compression["sample"] = .object([
                    "frames": JSONValue(compressionSample.frames), "events": JSONValue(compressionSample.events),
                    "wire_bytes_per_event": number(per.wire), "plain_frame_bytes_per_event": number(per.plain),
                    "zlib_alone_bytes_per_event": number(per.zlib),
                ])
            }
            out["websocket_compression"] = .object(compression)
        }
        return .object(out)
    }

    /// The report as one line of JSON.
    public var jsonText: String { json.jsonString }

    /// The human table.
    public var table: String {
        var rows: [(String, String)] = []
        let o = options
        var shape = "\(o.scenario.rawValue) over \(o.transport.rawValue), \(o.subscribers) subscribers"
        if o.scenario == .rooms { shape += " in \(o.rooms) rooms (\(o.roomsPerClient) each)" }
        if o.scenario != .idle {
            let payload = o.payload == .filler ? "\(o.payloadBytes)-byte" : o.payload.rawValue
            shape += ", \(o.publishers) publisher\(o.publishers == 1 ? "" : "s"), \(payload) payloads"
            shape += o.rate > 0 ? ", \(formatCount(o.rate)) publishes/s" : ", as fast as a window of \(o.window) allows"
            if o.batch > 1 { shape += ", batches of \(o.batch)" }
        }
        rows.append(("run", shape))
        rows.append(("server", "\(o.url)\(serverName.map { " (\($0))" } ?? "")"))
        rows.append(
            (
                "connections",
                "\(connected) ready\(workers > 0 ? " (\(workers) worker processes)" : ""), \(connectFailures) failed in \(format(setupSeconds, 1)) s; connect p50 \(format(connectTime.p50)) ms, p99 \(format(connectTime.p99)) ms, max \(format(connectTime.max)) ms"
            ))
        if o.scenario != .idle {
            rows.append(("measured", "\(format(measuredSeconds, 1)) s after \(format(o.warmup, 1)) s of warm-up"))
            rows.append(("publishes/s", "\(formatCount(publishesPerSecond)) (\(publishes) publishes)"))
            rows.append(("deliveries/s", "\(formatCount(deliveriesPerSecond)) (\(deliveries) deliveries)"))
        }
        if latency.count > 0 {
            rows.append(
                (
                    "latency ms",
                    "p50 \(format(latency.p50))  p90 \(format(latency.p90))  p99 \(format(latency.p99))  p99.9 \(format(latency.p999))  max \(format(latency.max))"
                ))
        }
        if ackLatency.count > 0 {
            rows.append(
                (
                    "ack latency ms",
                    "p50 \(format(ackLatency.p50))  p99 \(format(ackLatency.p99))  max \(format(ackLatency.max))"
                ))
        }
        rows.append(
            (
                "deliveries",
                "\(receivedDeliveries) of \(expectedDeliveries) expected: \(lost) lost, \(extra) extra, \(outOfOrder) out of order"
            ))
        if o.transport == .websocket {
            var text =
                o.compression
                ? "offered, accepted on \(compressionNegotiated) of \(connected) WebSockets" : "not offered"
            if let wire = wireBytesPerDelivery { text += "; \(format(wire, 1)) bytes on the wire per delivered event" }
            if let per = samplePerEvent {
                text +=
                    " (sample: \(format(per.wire, 1)) on the wire, \(format(per.plain, 1)) plain, \(format(per.zlib, 1)) zlib alone)"
            }
            rows.append(("compression", text))
        }
        if let limit { rows.append(("stopped by", limit.sentence)) }
        rows.append(("errors", errors == 0 ? "0" : "\(errors): \(errorSamples.joined(separator: "; "))"))
        let perWhat = deliveries > 0 ? "M deliveries" : "M publishes"
        if let server {
            var text = "\(format(server.cpuSeconds)) CPU s (\(format(server.cores * 100, 0))% of a core)"
            if let per = server.cpuSecondsPerMillion { text += ", \(format(per, 3)) CPU s per \(perWhat)" }
            text += ", RSS \(formatBytes(server.rssBytes))"
            rows.append(("server process", text))
        }
        if let serverRSSPerConnection, let serverBaselineRSS {
            rows.append(
                (
                    "server memory",
                    "\(formatBytes(Int(serverRSSPerConnection))) per connection (RSS \(formatBytes(serverBaselineRSS)) before connecting)"
                ))
        }
        if let bench {
            var text = "\(format(bench.cpuSeconds)) CPU s (\(format(bench.cores * 100, 0))% of a core)"
            if let per = bench.cpuSecondsPerMillion { text += ", \(format(per, 3)) CPU s per \(perWhat)" }
            if let ceiling = benchCeilingPerCore { text += "; ceiling ~\(formatCount(ceiling)) deliveries/s per core" }
            rows.append(("load generator", text))
        }
        let width = rows.map(\.0.count).max() ?? 0
        return rows.map { $0.0 + String(repeating: " ", count: width - $0.0.count + 2) + $0.1 }
            .joined(separator: "\n")
    }
}

func number(_ value: Double) -> JSONValue {
    guard value.isFinite else { return .null }
    return .number(format(value, 3))
}

func format(_ value: Double, _ decimals: Int = 2) -> String {
    guard value.isFinite else { return "-" }
    var scale = 1.0
    for _ in 0..<decimals { scale *= 10 }
    let rounded = (value * scale).rounded() / scale
    var text = String(rounded)
    if text.hasSuffix(".0"), decimals == 0 { text.removeLast(2) }
    if let dot = text.firstIndex(of: ".") {
        let have = text.distance(from: dot, to: text.endIndex) - 1
        if have < decimals { text += String(repeating: "0", count: decimals - have) }
    } else if decimals > 0 {
        text += "." + String(repeating: "0", count: decimals)
    }
    if text.contains("e") { return String(Int(rounded)) }
    return text
}

func formatCount(_ value: Double) -> String {
    let n = Int(value.rounded())
    var digits = Array(String(abs(n)))
    var out: [Character] = []
    while digits.count > 3 {
        out = [","] + digits.suffix(3) + out
        digits.removeLast(3)
    }
    return (n < 0 ? "-" : "") + String(digits + out)
}

func formatBytes(_ bytes: Int) -> String {
    let b = Double(bytes)
    if b >= Double(1 << 30) { return format(b / Double(1 << 30), 2) + " GiB" }
    if b >= Double(1 << 20) { return format(b / Double(1 << 20), 1) + " MiB" }
    if b >= Double(1 << 10) { return format(b / Double(1 << 10), 1) + " KiB" }
    return "\(bytes) B"
}
