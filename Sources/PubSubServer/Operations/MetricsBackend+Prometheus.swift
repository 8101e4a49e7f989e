import CoreMetrics
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Prometheus

/// The one place of the server that knows Prometheus: the backend over a `PrometheusCollectorRegistry`.
extension MetricsBackend {
    /// The server's metrics kept in `registry`, and `/metrics` rendering all of it. Pass the registry that
    /// swift-metrics is bootstrapped with (`PrometheusMetricsFactory(registry:)`) so that the metrics of the other
    /// parts of the process (a relay, the auth hook, webhooks) appear beside the server's.
    public static func prometheus(_ registry: PrometheusCollectorRegistry = PrometheusCollectorRegistry())
        -> MetricsBackend
    {
        let help = HelpTexts()
        return MetricsBackend(
            factory: DescribedPrometheusFactory(registry: registry, help: help),
            describe: { label, text in help.set(text, for: label) },
            render: { registry.emit(into: &$0) })
    }
}

extension ServerOperations {
    /// Operations whose metrics are kept in `registry` (tests).
    convenience init(
        configuration: OperationsConfiguration, loops: [any EventLoop], registry: PrometheusCollectorRegistry,
        timeouts: ConnectionTimeouts = ConnectionTimeouts(), logger: Logger
    ) {
        self.init(
            configuration: configuration, loops: loops, metrics: .prometheus(registry), timeouts: timeouts,
            logger: logger)
    }
}

/// Help texts by metric name, as `MetricsBackend.describe` gave them.
private final class HelpTexts: Sendable {
    private let texts = NIOLockedValueBox<[String: String]>([:])

    func set(_ text: String, for label: String) { texts.withLockedValue { $0[label] = text } }
    subscript(label: String) -> String { texts.withLockedValue { $0[label] ?? "" } }
}

/// `PrometheusMetricsFactory` with help texts: counters and gauges are registered with the text described for
/// their name (the registry requires one text per name, fixed by the first metric of that name), and the
/// dimensions are their labels, in order, as `PrometheusMetricsFactory` makes them. Histograms and timers, which
/// the server does not make, are the plain factory's.
private struct DescribedPrometheusFactory: CoreMetrics.MetricsFactory {
    let registry: PrometheusCollectorRegistry
    let help: HelpTexts
    let plain: PrometheusMetricsFactory

    init(registry: PrometheusCollectorRegistry, help: HelpTexts) {
        self.registry = registry
        self.help = help
        self.plain = PrometheusMetricsFactory(registry: registry)
    }

    /// The label as the whole name (no namespace or unit added), with its help text.
    private func descriptor(_ label: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: label, unitName: "", helpText: help[label])
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CoreMetrics.CounterHandler {
        registry.makeCounter(descriptor: descriptor(label), labels: dimensions)
    }

    func makeFloatingPointCounter(label: String, dimensions: [(String, String)])
        -> any CoreMetrics.FloatingPointCounterHandler
    {
        registry.makeCounter(descriptor: descriptor(label), labels: dimensions)
    }

    func makeMeter(label: String, dimensions: [(String, String)]) -> any CoreMetrics.MeterHandler {
        registry.makeGauge(descriptor: descriptor(label), labels: dimensions)
    }

    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any CoreMetrics.RecorderHandler
    {
        guard !aggregate else { return plain.makeRecorder(label: label, dimensions: dimensions, aggregate: true) }
        return registry.makeGauge(descriptor: descriptor(label), labels: dimensions)
    }

    func makeTimer(label: String, dimensions: [(String, String)]) -> any CoreMetrics.TimerHandler {
        plain.makeTimer(label: label, dimensions: dimensions)
    }

    func destroyCounter(_ handler: any CoreMetrics.CounterHandler) { plain.destroyCounter(handler) }
    func destroyFloatingPointCounter(_ handler: any CoreMetrics.FloatingPointCounterHandler) {
        plain.destroyFloatingPointCounter(handler)
    }
    func destroyMeter(_ handler: any CoreMetrics.MeterHandler) { plain.destroyMeter(handler) }
    func destroyRecorder(_ handler: any CoreMetrics.RecorderHandler) { plain.destroyRecorder(handler) }
    func destroyTimer(_ handler: any CoreMetrics.TimerHandler) { plain.destroyTimer(handler) }
}
