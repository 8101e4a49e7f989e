import Bayeux
import Dispatch
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import PubSubTesting
import Testing

@testable import PubSubCore

/// Publishes encoded out of the engine's lock, from several threads at once: every subscriber still gets every
/// event once, in position order, and the history holds them in that order.
@Suite struct ConcurrentPublishTests {
    @Test(arguments: [false, true])
    func concurrentPublishersAreQueuedInPositionOrder(compression: Bool) async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let loop = group.next()
        var configuration = BrokerConfiguration()
        configuration.historySize = 10_000
        configuration.maxQueue = 10_000
        configuration.eventCompression = compression ? EventCompression(minimumBytes: 0) : nil
        let engine = MemoryEngine(configuration: configuration)
        let clientId = try await engine.createClient(now: .now(), user: nil, on: loop).get()
        _ = try await engine.subscribe(clientId, to: ["/c/**"], resume: nil, now: .now(), on: loop).get()
        let sink = RecordingSink(loop: loop, persistent: true)
        let connected = try await engine.connect(
            clientId, now: .now(), sink: sink, receipt: ConnectReceipt(connectId: nil, ack: nil), on: loop
        ).get()
        #expect(connected.status == .ok)

        let threads = 4
        let each = 400
        DispatchQueue.concurrentPerform(iterations: threads) { thread in
            for n in 0..<each {
                var message = Message()
                message.channel = "/c/\(thread)"
                message["data"] = .object(["thread": JSONValue(thread), "n": JSONValue(n)])
                _ = engine.publish(message, to: "/c/\(thread)", now: .now(), on: loop)
            }
        }
        let total = threads * each
        let deadline = ContinuousClock.now + .seconds(20)
        while sink.events.count < total, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        let events = sink.events
        #expect(events.count == total)
        let sequences = events.compactMap { event -> UInt64? in
            guard let token = event.objectValue?["ext"]?.objectValue?["position"]?.stringValue else { return nil }
            return Position(token: token, key: engine.positionKey)?.sequence
        }
        #expect(sequences == Array(1...UInt64(total)), "every position once, in order")
        // Each publisher's own events in the order it published them.
        for thread in 0..<threads {
            let mine = events.compactMap { event -> Int? in
                guard let data = event.objectValue?["data"]?.objectValue, data["thread"] == JSONValue(thread) else {
                    return nil
                }
                return data["n"]?.doubleValue.map { Int($0) }
            }
            #expect(mine == Array(0..<each))
        }
        let held = engine.lock.withLock { engine.history.entries.map(\.sequence) }
        #expect(held == Array(1...UInt64(total)))
        try await group.shutdownGracefully()
    }
}
