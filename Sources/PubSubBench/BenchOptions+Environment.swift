#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The load generator's settings read from the environment, in one place: the defaults of `BenchOptions.compression`
/// and `BenchOptions.payload`, so that a `pubsub bench` whose command line has no flag for them yet (and the worker
/// processes it starts, which inherit the environment) can be told:
///
///     PUBSUB_BENCH_COMPRESSION=1          offer permessage-deflate (`--compression`)
///     PUBSUB_BENCH_PAYLOAD=job-progress   realistic payloads: job-progress (~1 KiB) or change-doc (~4 KiB)
///
/// A value it does not know is a problem `BenchOptions.problem()` reports, rather than measuring something else.
public struct BenchEnvironment: Sendable {
    public var compression = false
    public var payload = BenchPayload.filler
    /// A sentence about a value that was not understood.
    public var problem: String?

    public static let current = BenchEnvironment(
        compression: getenv("PUBSUB_BENCH_COMPRESSION").map { String(cString: $0) },
        payload: getenv("PUBSUB_BENCH_PAYLOAD").map { String(cString: $0) })

    /// From the variables' values (nil: unset).
    public init(compression: String?, payload: String?) {
        switch compression?.lowercased() {
        case nil, "", "0", "off", "false", "no": self.compression = false
        case "1", "on", "true", "yes": self.compression = true
        default: problem = "PUBSUB_BENCH_COMPRESSION must be on or off, not \(compression ?? "")"
        }
        guard let name = payload, !name.isEmpty else { return }
        if let kind = BenchPayload(rawValue: name) {
            self.payload = kind
        } else {
            problem =
                "PUBSUB_BENCH_PAYLOAD must be \(BenchPayload.allCases.map(\.rawValue).joined(separator: ", ")), not \(name)"
        }
    }
}
