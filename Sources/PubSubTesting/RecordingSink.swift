import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

/// A delivery sink that records what the engine hands it: the events (decoded) and the detaches, on any event
/// loop (an `EmbeddedEventLoop` for the broker's unit tests, a real one for the engine conformance suite).
// @unchecked: the recorded values are guarded by the lock of `box`; the rest is immutable.
public final class RecordingSink: DeliverySink, @unchecked Sendable {
    public let eventLoop: any EventLoop
    public let isPersistent: Bool
    private let box = NIOLockedValueBox<(events: [JSONValue], detaches: [DetachReason])>(([], []))

    public init(loop: any EventLoop, persistent: Bool) {
        self.eventLoop = loop
        self.isPersistent = persistent
    }

    /// Every event delivered, in order, as the JSON object of the message.
    public var events: [JSONValue] { box.withLockedValue { $0.events } }
    /// The `data` of every event delivered.
    public var data: [JSONValue] { events.map { $0.objectValue?["data"] ?? .null } }
    public var detaches: [DetachReason] { box.withLockedValue { $0.detaches } }

    public func deliver(_ events: CircularBuffer<WireEvent>) {
        let decoded = events.map { try! JSONParser().parse($0.json).arrayValue![0] }
        box.withLockedValue { $0.events.append(contentsOf: decoded) }
    }

    public func detached(_ reason: DetachReason) {
        box.withLockedValue { $0.detaches.append(reason) }
    }
}

/// JSON text a test writes, parsed (a crash on a typo in the test is fine).
public func json(_ text: String) -> JSONValue { try! JSONParser().parse(text) }
