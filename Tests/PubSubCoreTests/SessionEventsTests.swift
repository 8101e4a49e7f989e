import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import PubSubTesting
import Testing

@testable import PubSubCore

/// Records what the engine reports.
final class RecordingObserver: SessionEventObserver {
    private let box = NIOLockedValueBox<[SessionEvent]>([])
    var events: [SessionEvent] { box.withLockedValue { $0 } }
    func sessionEvents(_ events: [SessionEvent]) { box.withLockedValue { $0.append(contentsOf: events) } }
}

@Suite struct SessionEventsTests {
    let loop = EmbeddedEventLoop()
    let now = NIODeadline.uptimeNanoseconds(1_000_000_000)

    func engine(_ observer: RecordingObserver, maxQueue: Int = 1000) -> MemoryEngine {
        MemoryEngine(configuration: .init(timeout: .seconds(1), maxQueue: maxQueue), events: observer)
    }

    @Test func handshakeSubscribeUnsubscribeAndClientDisconnect() throws {
        let observer = RecordingObserver()
        let engine = engine(observer)
        let id = try engine.createClient(now: now, on: loop).wait()
        _ = try engine.subscribe(id, to: ["/a", "/b/*", "/a"], resume: nil, now: now, on: loop).wait()
        // Subscribing again to a held channel is not a new subscription.
        _ = try engine.subscribe(id, to: ["/a"], resume: nil, now: now, on: loop).wait()
        _ = try engine.unsubscribe(id, from: ["/b/*", "/never"], on: loop).wait()
        _ = try engine.destroyClient(id, reason: .disconnected, on: loop).wait()
        #expect(
            observer.events == [
                SessionEvent(kind: .handshake, clientId: id),
                SessionEvent(kind: .subscribe, clientId: id, channel: "/a"),
                SessionEvent(kind: .subscribe, clientId: id, channel: "/b/*"),
                SessionEvent(kind: .unsubscribe, clientId: id, channel: "/b/*"),
                SessionEvent(kind: .disconnect, clientId: id, reason: .client),
            ])
    }

    @Test func expiryOverflowAndKickEndSessionsWithTheirReason() throws {
        let observer = RecordingObserver()
        let engine = engine(observer, maxQueue: 1)
        let slow = try engine.createClient(now: now, on: loop).wait()
        let idle = try engine.createClient(now: now, on: loop).wait()
        let kicked = try engine.createClient(now: now, on: loop).wait()
        _ = try engine.subscribe(slow, to: ["/x"], resume: nil, now: now, on: loop).wait()
        var event = Message()
        event.channel = "/x"
        event["data"] = 1
        _ = try engine.publish(event, to: "/x", now: now, on: loop).wait()
        _ = try engine.publish(event, to: "/x", now: now, on: loop).wait()
        _ = try engine.destroyClient(kicked, reason: .kicked, on: loop).wait()
        // Superseded and shutdown detach a sink; the session goes on, so nothing is reported.
        engine.shutdown()
        _ = try engine.connect(idle, now: now, sink: nil, on: loop).wait()
        engine.sweep(now: now + .seconds(2))
        let ends = observer.events.filter { $0.kind == .disconnect }
        #expect(
            ends == [
                SessionEvent(kind: .disconnect, clientId: slow, reason: .overflow),
                SessionEvent(kind: .disconnect, clientId: kicked, reason: .kicked),
                SessionEvent(kind: .disconnect, clientId: idle, reason: .expired),
            ])
    }

    @Test func withoutAnObserverNothingIsRecorded() throws {
        let engine = MemoryEngine(configuration: .init())
        let id = try engine.createClient(now: now, on: loop).wait()
        _ = try engine.subscribe(id, to: ["/a"], resume: nil, now: now, on: loop).wait()
        #expect(try engine.destroyClient(id, reason: .disconnected, on: loop).wait())
    }
}

/// A polling client between two polls has no connection to see its drop: the engine logs it, once.
@Suite struct UnattachedDropLogTests {
    final class Lines: @unchecked Sendable {
        private let box = NIOLockedValueBox<[(String, Logger.Metadata)]>([])
        var all: [(String, Logger.Metadata)] { box.withLockedValue { $0 } }
        func append(_ line: String, _ metadata: Logger.Metadata) { box.withLockedValue { $0.append((line, metadata)) } }
    }

    struct Handler: LogHandler {
        let lines: Lines
        var logLevel: Logger.Level = .info
        var metadata: Logger.Metadata = [:]
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) { lines.append("\(event.message)", event.metadata ?? [:]) }
    }

    @Test func aPollingClientDroppedBetweenPollsIsLoggedWithItsId() throws {
        let loop = EmbeddedEventLoop()
        let now = NIODeadline.uptimeNanoseconds(1_000_000_000)
        let lines = Lines()
        let engine = MemoryEngine(
            configuration: .init(timeout: .seconds(10), maxQueue: 3),
            logger: Logger(label: "test") { _ in Handler(lines: lines) })
        let slow = try engine.createClient(now: now, on: loop).wait()
        let attached = try engine.createClient(now: now, on: loop).wait()
        _ = try engine.subscribe(slow, to: ["/a"], resume: nil, now: now, on: loop).wait()
        _ = try engine.subscribe(attached, to: ["/a"], resume: nil, now: now, on: loop).wait()
        // The attached client's connection logs its own drop; the engine says nothing of it.
        _ = try engine.connect(attached, now: now, sink: RecordingSink(loop: loop, persistent: true), on: loop).wait()
        for _ in 0..<4 {
            _ = try engine.publish(Message(), to: "/a", now: now, on: loop).wait()
            loop.run()
        }
        let drops = lines.all.filter { $0.0 == "slow consumer dropped: queue overflow" }
        #expect(drops.count == 1)
        #expect(drops.first?.1["pubsub.client.id"] == .string(slow))
        #expect(try engine.clientExists(slow, on: loop).wait() == false)
    }
}
