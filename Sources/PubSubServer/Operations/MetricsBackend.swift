import CoreMetrics

/// Where a server's metrics go, and the text `/metrics` serves.
///
/// The server makes its counters and gauges once, as swift-metrics types (`Counter`, `Meter`) with `factory`, not
/// through the process-wide `MetricsSystem`: that is bootstrapped once per process, and every server of a process
/// (tests start several) keeps metrics of its own. swift-metrics carries a label and dimensions only, so the
/// server tells `describe` each metric's help text before making it (Prometheus prints it as `# HELP`).
/// `MetricsBackend.prometheus(_:)` is the backend of `pubsub serve`.
public struct MetricsBackend: Sendable {
    /// Makes the handlers of the server's metrics.
    public var factory: any MetricsFactory
    /// Told a metric's label and help text before the metric is made.
    public var describe: @Sendable (_ label: String, _ help: String) -> Void
    /// Appends the text of every metric, as `/metrics` serves it.
    public var render: @Sendable (_ text: inout [UInt8]) -> Void

    public init(
        factory: any MetricsFactory,
        describe: @escaping @Sendable (_ label: String, _ help: String) -> Void = { _, _ in },
        render: @escaping @Sendable (_ text: inout [UInt8]) -> Void
    ) {
        self.factory = factory
        self.describe = describe
        self.render = render
    }

    /// A counter with its help text.
    func counter(_ label: String, _ dimensions: [(String, String)] = [], help: String) -> Counter {
        describe(label, help)
        return Counter(label: label, dimensions: dimensions, factory: factory)
    }

    /// A gauge (a swift-metrics `Meter`: set, or moved up and down) with its help text.
    func gauge(_ label: String, _ dimensions: [(String, String)] = [], help: String) -> Meter {
        describe(label, help)
        return Meter(label: label, dimensions: dimensions, factory: factory)
    }
}
