import Bayeux
import NIOCore
import Prometheus
import Testing

@testable import PubSubCore
@testable import PubSubServer

#if canImport(Glibc)
    import Glibc
#endif

@Suite struct MetricsTests {
    func render(_ registry: PrometheusCollectorRegistry) -> String {
        String(decoding: registry.emitToBuffer(), as: UTF8.self)
    }

    @Test func engineTotalsBecomeCounterIncrements() {
        let registry = PrometheusCollectorRegistry()
        let metrics = ServerMetrics(backend: .prometheus(registry))
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

    /// Recorded through swift-metrics, rendered by the registry: help, type and labels as Prometheus metrics made
    /// on the registry directly.
    @Test func thePrometheusBackendKeepsHelpTypesAndLabels() {
        let registry = PrometheusCollectorRegistry()
        let metrics = ServerMetrics(backend: .prometheus(registry))
        metrics.error(.badRequest)
        var stats = EngineStatistics()
        stats.clients = 3
        metrics.update(engine: stats, loops: LoopCounters.Snapshot(bytesOut: 0, clients: [0, 0, 0, 1, 0, 0]))
        metrics.rateLimited[.ip]?.increment()
        metrics.update(engineMetrics: [
            EngineMetric(name: "pubsub_test_losses_total", help: "Test losses.", kind: .counter, value: 4),
            EngineMetric(name: "pubsub_test_level", help: "Test level.", kind: .gauge, value: 9),
        ])
        let text = render(registry)
        #expect(
            text.contains(
                "# HELP pubsub_request_errors_total Requests and connections that failed, by kind.\n"
                    + "# TYPE pubsub_request_errors_total counter\n"))
        #expect(text.contains(#"pubsub_request_errors_total{kind="bad_request"} 1"#))
        #expect(text.contains(#"pubsub_request_errors_total{kind="tls"} 0"#))
        #expect(
            text.contains(
                "# HELP pubsub_sessions Bayeux sessions (client ids) alive in the engine.\n"
                    + "# TYPE pubsub_sessions gauge\npubsub_sessions 3.0\n"))
        #expect(text.contains(#"pubsub_clients{transport="websocket"} 1.0"#))
        #expect(text.contains(#"pubsub_publish_rate_limited_total{scope="ip"} 1"#))
        #expect(
            text.contains("# HELP pubsub_test_losses_total Test losses.\n# TYPE pubsub_test_losses_total counter\n"))
        #expect(text.contains("pubsub_test_losses_total 4\n"))
        #expect(text.contains("# TYPE pubsub_test_level gauge\npubsub_test_level 9.0\n"))
    }

    /// Each server of a process has metrics of its own (tests start several; `MetricsSystem` is bootstrapped once).
    @Test func serversOfOneProcessCountApart() {
        let first = PrometheusCollectorRegistry()
        let second = PrometheusCollectorRegistry()
        let a = ServerMetrics(backend: .prometheus(first))
        _ = ServerMetrics(backend: .prometheus(second))
        a.error(.tls)
        #expect(render(first).contains(#"pubsub_request_errors_total{kind="tls"} 1"#))
        #expect(render(second).contains(#"pubsub_request_errors_total{kind="tls"} 0"#))
    }

    @Test func repliesWithErrorsAreCountedByReasonAndCode() {
        let registry = PrometheusCollectorRegistry()
        let ext = MetricsExtension(backend: .prometheus(registry))
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

    #if canImport(Glibc)
        @Test func heapAllocatedCountsAnAllocationUntilItIsFreed() throws {
            let size = 64 << 20
            // Other tests allocate and free on other threads meanwhile, tens of megabytes at a time: half the block
            // is the margin for them, and the measure is taken again (up to five times) when they took more. A
            // figure that never counts the block fails every time.
            var seen: [(held: Int, freed: Int)] = []
            for _ in 0..<5 {
                let before = try #require(ProcessMemory.heapAllocatedBytes())
                let block = try #require(malloc(size))
                memset(block, 1, size)
                let holding = try #require(ProcessMemory.heapAllocatedBytes())
                free(block)
                let after = try #require(ProcessMemory.heapAllocatedBytes())
                seen.append((holding - before, holding - after))
                if holding - before >= size / 2 && holding - after >= size / 2 { break }
            }
            let counted = seen.contains { $0.held >= size / 2 && $0.freed >= size / 2 }
            #expect(counted, "held and freed per attempt: \(seen)")
        }

        @Test func heapInUseIsReadFromTheTotalsOfMallocInfo() {
            let xml = """
                <malloc version="1">
                <heap nr="0">
                <total type="fast" count="1" size="32"/>
                <total type="rest" count="2" size="1000"/>
                <system type="current" size="900000"/>
                </heap>
                <total type="fast" count="3" size="96"/>
                <total type="rest" count="5" size="4000"/>
                <total type="mmap" count="1" size="1052672"/>
                <system type="current" size="2000000"/>
                <system type="max" size="2000000"/>
                <aspace type="total" size="2000000"/>
                </malloc>
                """
            #expect(MallocInfo.allocated(inXML: xml) == 2_000_000 - 96 - 4000 + 1_052_672)
            #expect(MallocInfo.allocated(inXML: "<malloc version=\"1\">\n</malloc>") == nil)
        }

        @Test func memoryGaugesAreServed() throws {
            let registry = PrometheusCollectorRegistry()
            let metrics = ServerMetrics(backend: .prometheus(registry))
            metrics.update(memory: ProcessMemory(heapAllocated: 123_456, resident: 7_654_321))
            let text = render(registry)
            #expect(text.contains("pubsub_heap_allocated_bytes 123456.0"))
            #expect(text.contains("process_resident_memory_bytes 7654321.0"))
            let resident = try #require(ProcessMemory.residentBytes())
            #expect(resident > 1 << 20)
        }
    #endif

    @Test func statusLineSaysClientsAndRates() {
        var stats = EngineStatistics()
        stats.clients = 7
        stats.subscriptions = 9
        let loops = LoopCounters.Snapshot(bytesOut: 0, clients: [2, 0, 0, 5, 0, 0])
        let line = ServerOperations.statusLine(stats: stats, loops: loops, rates: (12.34, 0), phase: .serving)
        #expect(
            line
                == "7 clients (long-polling 2, websocket 5), 9 subscriptions; 12.3 msg/s published, 0.0 msg/s delivered"
        )
    }
}
