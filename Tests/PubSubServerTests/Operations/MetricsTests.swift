import Bayeux
import NIOCore
import Prometheus
@testable import PubSubCore
import Testing

@testable import PubSubServer

@Suite struct MetricsTests {
    func render(_ registry: PrometheusCollectorRegistry) -> String {
        String(decoding: registry.emitToBuffer(), as: UTF8.self)
    }

    @Test func engineTotalsBecomeCounterIncrements() {
        let registry = PrometheusCollectorRegistry()
        let metrics = ServerMetrics(registry: registry)
        var stats = EngineStatistics()
        stats.clients = 3
        stats.subscriptions = 4
        stats.published = 10
        stats.queued = 25
        stats.queueDepth = 2
        var loops = LoopCounters.Snapshot(bytesOut: 1000, clients: [1, 0, 0, 2, 0, 0])
        metrics.update(engine: stats, loops: loops)
        stats.published = 12
        loops.bytesOut = 1500
        metrics.update(engine: stats, loops: loops)
        let text = render(registry)
        #expect(text.contains("pubsub_messages_published_total 12"))
        #expect(text.contains("pubsub_messages_delivered_total 25"))
        #expect(text.contains("pubsub_bytes_out_total 1500"))
        #expect(text.contains("pubsub_sessions 3.0"))
        #expect(text.contains("pubsub_queue_depth 2.0"))
        #expect(text.contains(#"pubsub_clients{transport="websocket"} 2.0"#))
        #expect(text.contains(#"pubsub_clients{transport="long-polling"} 1.0"#))
    }

    @Test func repliesWithErrorsAreCountedByReasonAndCode() {
        let registry = PrometheusCollectorRegistry()
        let ext = MetricsExtension(registry: registry)
        let context = RequestContext(connectionType: .longPolling)
        for error in [PrivatePubAuth.incorrectToken, PrivatePubAuth.incorrectToken, "401:abc:Unknown client", "oops"] {
            var reply = Message()
            reply.fail(error)
            #expect(ext.outgoing(&reply, context: context))
        }
        var ok = Message()
        ok["successful"] = .bool(true)
        #expect(ext.outgoing(&ok, context: context))
        let text = render(registry)
        #expect(text.contains(#"pubsub_auth_refusals_total{reason="bad_token"} 2"#))
        #expect(text.contains(#"pubsub_auth_refusals_total{reason="bad_signature"} 0"#))
        #expect(text.contains(#"pubsub_bayeux_errors_total{code="401"} 1"#))
        #expect(text.contains(#"pubsub_bayeux_errors_total{code="other"} 1"#))
    }

    @Test func statusLineSaysClientsAndRates() {
        var stats = EngineStatistics()
        stats.clients = 7
        stats.subscriptions = 9
        let loops = LoopCounters.Snapshot(bytesOut: 0, clients: [2, 0, 0, 5, 0, 0])
        let line = ServerOperations.statusLine(stats: stats, loops: loops, rates: (12.34, 0), phase: .serving)
        #expect(line == "7 clients (long-polling 2, websocket 5), 9 subscriptions; 12.3 msg/s published, 0.0 msg/s delivered")
    }
}
