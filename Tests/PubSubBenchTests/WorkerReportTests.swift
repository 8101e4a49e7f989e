import Bayeux
import Histogram
import Testing

@testable import PubSubBench

@Suite struct WorkerReportTests {
    static func histogram(_ values: [UInt64]) -> Histogram<UInt64> {
        var h = Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .three)
        for v in values { _ = h.record(v) }
        return h
    }

    @Test func histogramsMergeExactlyThroughTheLine() throws {
        var random = SystemRandomNumberGenerator()
        let a = (0..<5000).map { _ in UInt64.random(in: 1...2_000_000, using: &random) }
        let b = (0..<3000).map { _ in UInt64.random(in: 100...90_000_000, using: &random) }
        let one = WorkerReport(
            ready: 10, failed: 1, deliveries: 5000, deliveriesInWindow: 4000, latency: Self.histogram(a))
        let two = WorkerReport(
            ready: 7, failed: 0, deliveries: 3000, deliveriesInWindow: 2900, outOfOrder: 2, errors: 1,
            errorSamples: ["connect: Too many open files"], limit: .descriptors, latency: Self.histogram(b))
        // Each goes through its JSON line, as between processes.
        let lines = try [one, two].map { r in
            try #require(WorkerReport(json: try JSONParser().parse(r.json.jsonString)))
        }
        let total = WorkerReport.combine(lines)
        let all = Self.histogram(a + b)
        #expect(total.ready == 17)
        #expect(total.failed == 1)
        #expect(total.deliveries == 8000)
        #expect(total.deliveriesInWindow == 6900)
        #expect(total.outOfOrder == 2)
        #expect(total.errors == 1)
        #expect(total.limit == .descriptors)
        #expect(total.errorSamples == ["connect: Too many open files"])
        #expect(total.latency.totalCount == all.totalCount)
        for p in [0.0, 50, 90, 99, 99.9, 100] {
            #expect(total.latency.valueAtPercentile(p) == all.valueAtPercentile(p))
        }
        #expect(total.latency.max == all.max)
        #expect(total.latency.min == all.min)
        // One value, and one bucket holding two values, come back exact.
        for values: [UInt64] in [[1234], [100_001, 100_002]] {
            let line = WorkerReport(latency: Self.histogram(values)).json.jsonString
            let back = try #require(WorkerReport(json: try JSONParser().parse(line))).latency
            #expect(
                back.min == values.min()! && back.maxRecorded == values.max()!
                    && back.totalCount == UInt64(values.count))
        }
    }

    @Test func limitsAreNamedFromTheErrors() {
        #expect(
            BenchLimit.classify("connect: connect(descriptor:addr:size:): Too many open files (errno: 24)")
                == .descriptors)
        #expect(BenchLimit.classify("connect: Cannot assign requested address (errno: 99)") == .ephemeralPorts)
        #expect(BenchLimit.classify("websocket upgrade refused: HTTP 503") == .server503)
        #expect(BenchLimit.classify("connect: Cannot allocate memory") == .memory)
        #expect(BenchLimit.classify("subscribe failed: 403::forbidden") == nil)
    }

    @Test func planSpreadsSubscribersAndAddresses() throws {
        let addresses = WorkerPlan.loopbackAddresses(count: 4)
        #expect(addresses == ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"])
        let plan = try WorkerPlan(
            subscribers: 10, workers: 2, addresses: addresses, perAddress: 3, descriptorLimit: 1000)
        #expect(plan.shares.map(\.subscribers) == [5, 5])
        #expect(plan.shares.map(\.sourceAddresses) == [["127.0.0.2", "127.0.0.3"], ["127.0.0.4", "127.0.0.5"]])
        #expect(WorkerPlan.loopbackAddresses(count: 1, from: 256) == ["127.0.1.0"])
    }

    @Test func planNamesTheLimitItWouldBreak() {
        #expect(throws: BenchError.self) {
            try WorkerPlan(subscribers: 100_000, workers: 4, addresses: [], perAddress: 3000, descriptorLimit: 20_000)
        }
        do {
            _ = try WorkerPlan(
                subscribers: 100_000, workers: 4, addresses: [], perAddress: 3000, descriptorLimit: 20_000)
        } catch {
            #expect("\(error)".contains("descriptor limit of 20000"))
            #expect("\(error)".contains("--workers 6"))
        }
        #expect(throws: BenchError.self) {
            try WorkerPlan(subscribers: 10, workers: 1, addresses: ["127.0.0.2"], perAddress: 3, descriptorLimit: 1000)
        }
    }

    @Test func commandsRoundTrip() {
        for c in [WorkerCommand.window(start: 12, end: 99), .finish(publishes: 30, deadline: 123_456)] {
            #expect(WorkerCommand(line: c.line) == c)
        }
        #expect(WorkerCommand(line: "nonsense") == nil)
    }

    @Test func clientsSpreadOverTargetsAndSourceAddresses() throws {
        var o = BenchOptions(url: try #require(BenchURL("http://127.0.0.1:1/faye")), subscribers: 6)
        o.moreURLs = [try #require(BenchURL("http://127.0.0.1:2/faye"))]
        o.sourceAddresses = ["127.0.0.2", "127.0.0.3"]
        o.perAddress = 3
        #expect((0..<6).map { o.endpoint($0).target.port } == [1, 2, 1, 2, 1, 2])
        #expect(
            (0..<6).map { o.endpoint($0).source } == [
                "127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3", "127.0.0.3",
            ])
        // A worker whose share starts at client 3 continues the run-wide alternation.
        o.firstIndex = 3
        #expect(o.endpoint(0).target.port == 2)
        #expect(o.problem() == nil)
        o.subscribers = 7
        #expect(o.problem()?.contains("hold fewer than 7") == true)
    }
}
