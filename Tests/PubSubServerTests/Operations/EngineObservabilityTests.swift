import Logging
import NIOCore
import NIOPosix
import Prometheus
import PubSubCore
import Testing

@testable import PubSubServer

/// A data-path engine that also reports readiness and a metric of its own (`EngineObservability`).
final class ObservedEngine: DataPathOnlyEngine, EngineObservability, @unchecked Sendable {
    var isReady: Bool { false }
    var extraMetrics: [EngineMetric] {
        [EngineMetric(name: "pubsub_test_outages_total", help: "Test outages.", kind: .counter, value: 3)]
    }
}

/// Readiness and `/metrics` with and without `EngineObservability`.
@Suite struct EngineObservabilityTests {
    func operations() -> ServerOperations {
        ServerOperations(
            configuration: OperationsConfiguration(), loops: [], registry: PrometheusCollectorRegistry(),
            logger: Logger(label: "test"))
    }

    func render(_ operations: ServerOperations, _ engine: any Engine) async throws -> String {
        let buffer = try await operations.renderMetrics(
            engine: engine, on: MultiThreadedEventLoopGroup.singleton.next()
        ).get()
        return String(buffer: buffer)
    }

    @Test func anEngineWithoutObservabilityIsReadyWithTheServerAndAddsNoMetrics() async throws {
        let operations = operations()
        let engine = DataPathOnlyEngine()
        #expect(!operations.isReady(engine: engine), "not serving yet")
        operations.setPhase(.serving)
        #expect(operations.isReady(engine: engine))
        let text = try await render(operations, engine)
        #expect(text.contains("pubsub_ready 1.0"))
        #expect(!text.contains("pubsub_test_outages_total"))
    }

    @Test func anObservedEngineSaysWhenItIsReadyAndWhatItCounts() async throws {
        let operations = operations()
        operations.setPhase(.serving)
        let engine = ObservedEngine()
        #expect(!operations.isReady(engine: engine))
        let text = try await render(operations, engine)
        #expect(text.contains("pubsub_ready 0.0"))
        #expect(text.contains("# HELP pubsub_test_outages_total Test outages."))
        #expect(text.contains("pubsub_test_outages_total 3"))
    }
}
