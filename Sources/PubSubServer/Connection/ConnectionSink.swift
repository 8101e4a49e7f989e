import NIOCore
import PubSubCore

/// The delivery sink of one connection for one session: a parked poll (one-shot), a WebSocket bound to a
/// client or an EventSource stream (persistent). It only forwards to its connection's `ConnectionDriver`, on the
/// driver's loop, with its generation: the driver takes the calls of its current sink only, so a sink it has let
/// go of (answered, rebound, closed) changes nothing, whatever the engine still holds.
final class ConnectionSink: DeliverySink, @unchecked Sendable {
    private let driver: NIOLoopBound<ConnectionDriver>
    let generation: UInt32
    let isPersistent: Bool

    var eventLoop: any EventLoop { driver.eventLoop }

    init(driver: ConnectionDriver, generation: UInt32, isPersistent: Bool, eventLoop: any EventLoop) {
        self.driver = NIOLoopBound(driver, eventLoop: eventLoop)
        self.generation = generation
        self.isPersistent = isPersistent
    }

    func deliver(_ events: CircularBuffer<ByteBuffer>) {
        driver.value.deliver(events, generation: generation)
    }

    func detached(_ reason: DetachReason) {
        driver.value.detached(reason, generation: generation)
    }
}
