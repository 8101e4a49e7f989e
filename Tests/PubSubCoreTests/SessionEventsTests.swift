import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
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
        try engine.publish(event, to: "/x", now: now, on: loop).wait()
        try engine.publish(event, to: "/x", now: now, on: loop).wait()
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
