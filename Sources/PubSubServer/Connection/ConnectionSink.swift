import NIOCore
import PubSubCore

/// What a connection handler does with the calls of its sinks; called on the handler's event loop.
protocol ConnectionSinkOwner: AnyObject {
    func deliver(_ sink: ConnectionSink, events: CircularBuffer<ByteBuffer>)
    func detached(_ sink: ConnectionSink, reason: DetachReason)
}

/// The delivery sink of one connection for one session: a parked poll (one-shot), a WebSocket bound to a
/// client or an EventSource stream (persistent). It only forwards to its handler, which feeds its
/// `ConnectionStateMachine`; a sink the handler has let go of (`closed`) forwards nothing.
final class ConnectionSink: DeliverySink, @unchecked Sendable {
    // `closed` is touched on `eventLoop` only.
    private let owner: NIOLoopBound<any ConnectionSinkOwner>
    let isPersistent: Bool
    /// Set on the event loop once the handler no longer wants this sink's calls (rebound, answered, closed).
    var closed = false

    var eventLoop: any EventLoop { owner.eventLoop }

    init(owner: any ConnectionSinkOwner, isPersistent: Bool, eventLoop: any EventLoop) {
        self.owner = NIOLoopBound(owner, eventLoop: eventLoop)
        self.isPersistent = isPersistent
    }

    func deliver(_ events: CircularBuffer<ByteBuffer>) {
        guard !closed else { return }
        owner.value.deliver(self, events: events)
    }

    func detached(_ reason: DetachReason) {
        guard !closed else { return }
        owner.value.detached(self, reason: reason)
    }
}
