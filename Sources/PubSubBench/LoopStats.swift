import Histogram
import NIOCore

/// What the clients of one event loop measured. Touched only on that loop (no locks on the receive path);
/// the runner reads it with `submit` and merges the loops at the end.
// @unchecked: loop-bound without `NIOLoopBound`: counted on its loop only, read there (`submit`) when the run ends.
final class LoopStats: @unchecked Sendable {
    /// Measurement window in monotonic nanoseconds: latencies count for messages sent in it, receipts for the
    /// delivery rate when they arrive in it.
    var windowStart: UInt64 = .max
    var windowEnd: UInt64 = .max

    var latency = LoopStats.makeHistogram()
    var ackLatency = LoopStats.makeHistogram()
    var connectTime = LoopStats.makeHistogram()

    var deliveries = 0
    var deliveriesInWindow = 0
    var lastDelivery: UInt64 = 0
    var duplicates = 0
    var gaps = 0

    var publishesSent = 0
    var publishesInWindow = 0
    var acks = 0
    var publishFailures = 0

    var connected = 0
    var connectFailures = 0
    var errors = 0
    var errorSamples: [String] = []

    /// Bytes read from subscribers' WebSockets (frames and their headers, as the socket handed them over) while
    /// the window was open; divided by the deliveries in the window, the bytes on the wire per delivered event.
    var subscriberWireBytesInWindow = 0
    /// WebSockets whose upgrade response accepted permessage-deflate.
    var compressionNegotiated = 0
    /// A sample of the frames that carried events (the first `compressionSampleLimit` of this loop): the events
    /// in them, their bytes on the wire, the bytes the same messages take as plain frames and as frames
    /// compressed by zlib alone.
    var sample = CompressionSample()
    static let compressionSampleLimit = 256
    /// Data messages subscribers read, for spreading the sample.
    var messagesSeen = 0
    /// The loop's inflater and sample deflater (`--compression`), made when first needed.
    lazy var compression = LoopCompression()

    static func makeHistogram() -> Histogram<UInt64> {
        // Microseconds, 1 µs to 1 hour, 3 significant digits.
        Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .three)
    }

    func recordError(_ text: String) {
        errors += 1
        if errorSamples.count < 8, !errorSamples.contains(text) { errorSamples.append(text) }
    }

    @inline(__always) func delivered(_ marker: ReplyScanner.Marker, now: UInt64) {
        deliveries += 1
        lastDelivery = now
        if marker.sentAt >= windowStart, marker.sentAt < windowEnd {
            _ = latency.record(now > marker.sentAt ? (now - marker.sentAt) / 1000 : 0)
        }
        if now >= windowStart, now < windowEnd { deliveriesInWindow += 1 }
    }

    /// `count` bytes were read from a subscriber's socket at `now`.
    @inline(__always) func wireRead(_ count: Int, now: UInt64) {
        if now >= windowStart, now < windowEnd { subscriberWireBytesInWindow += count }
    }

    var snapshot: Snapshot {
        Snapshot(
            deliveries: deliveries, deliveriesInWindow: deliveriesInWindow, publishesSent: publishesSent,
            acks: acks, publishFailures: publishFailures, errors: errors + publishFailures + connectFailures,
            connected: connected,
            latencyP99: latency.totalCount > 0 ? latency.valueAtPercentile(99) : 0)
    }

    struct Snapshot: Sendable {
        var deliveries: Int
        var deliveriesInWindow: Int
        var publishesSent: Int
        var acks: Int
        var publishFailures: Int
        var errors: Int
        var connected: Int
        var latencyP99: UInt64

        static func + (a: Snapshot, b: Snapshot) -> Snapshot {
            Snapshot(
                deliveries: a.deliveries + b.deliveries,
                deliveriesInWindow: a.deliveriesInWindow + b.deliveriesInWindow,
                publishesSent: a.publishesSent + b.publishesSent, acks: a.acks + b.acks,
                publishFailures: a.publishFailures + b.publishFailures, errors: a.errors + b.errors,
                connected: a.connected + b.connected,
                latencyP99: max(a.latencyP99, b.latencyP99))
        }

        static let zero = Snapshot(
            deliveries: 0, deliveriesInWindow: 0, publishesSent: 0, acks: 0, publishFailures: 0, errors: 0,
            connected: 0, latencyP99: 0)
    }

    /// What stopped connections from opening, read from the errors met.
    var limit: BenchLimit? {
        connectFailures > 0 ? errorSamples.lazy.compactMap(BenchLimit.classify).first : nil
    }

    /// Adds what worker processes measured (their subscribers) into this one.
    func merge(_ workers: WorkerReport) {
        latency.add(workers.latency)
        connectTime.add(workers.connectTime)
        deliveries += workers.deliveries
        deliveriesInWindow += workers.deliveriesInWindow
        duplicates += workers.outOfOrder
        gaps += workers.gaps
        connected += workers.ready
        connectFailures += workers.failed
        errors += workers.errors
        subscriberWireBytesInWindow += workers.subscriberWireBytesInWindow
        compressionNegotiated += workers.compressionNegotiated
        sample.add(workers.sample)
        for sample in workers.errorSamples where errorSamples.count < 8 && !errorSamples.contains(sample) {
            errorSamples.append(sample)
        }
    }

    /// Adds another loop's numbers into this one (run on the runner's side, after the load stopped).
    func merge(_ other: LoopStats) {
        latency.add(other.latency)
        ackLatency.add(other.ackLatency)
        connectTime.add(other.connectTime)
        deliveries += other.deliveries
        deliveriesInWindow += other.deliveriesInWindow
        lastDelivery = max(lastDelivery, other.lastDelivery)
        duplicates += other.duplicates
        gaps += other.gaps
        publishesSent += other.publishesSent
        publishesInWindow += other.publishesInWindow
        acks += other.acks
        publishFailures += other.publishFailures
        connected += other.connected
        connectFailures += other.connectFailures
        errors += other.errors
        subscriberWireBytesInWindow += other.subscriberWireBytesInWindow
        compressionNegotiated += other.compressionNegotiated
        sample.add(other.sample)
        for sample in other.errorSamples where errorSamples.count < 8 && !errorSamples.contains(sample) {
            errorSamples.append(sample)
        }
    }
}

@inline(__always) func monotonicNanoseconds() -> UInt64 { NIODeadline.now().uptimeNanoseconds }

/// Frames that carried events, sampled by the subscribers: what they took on the wire against what the same
/// messages take as plain frames and compressed by zlib alone (`LoopCompression.zlibAloneFrameBytes`).
public struct CompressionSample: Sendable, Equatable {
    public var frames = 0
    public var events = 0
    /// Header plus payload as received (compressed or not).
    public var wireBytes = 0
    /// Header plus payload of the same messages sent uncompressed.
    public var plainBytes = 0
    /// Header plus payload of the same messages compressed by zlib alone.
    public var zlibBytes = 0

    public init(frames: Int = 0, events: Int = 0, wireBytes: Int = 0, plainBytes: Int = 0, zlibBytes: Int = 0) {
        self.frames = frames
        self.events = events
        self.wireBytes = wireBytes
        self.plainBytes = plainBytes
        self.zlibBytes = zlibBytes
    }

    mutating func add(_ other: CompressionSample) {
        frames += other.frames
        events += other.events
        wireBytes += other.wireBytes
        plainBytes += other.plainBytes
        zlibBytes += other.zlibBytes
    }
}
