import NIOCore
import PubSubCore

/// The delivery sink of one connection for one session: a parked poll (one-shot), a WebSocket bound to a
/// client or an EventSource stream (persistent). It only forwards to its connection's `ConnectionDriver`, on the
/// driver's loop, with its generation: the driver takes the calls of its current sink only, so a sink it has let
/// go of (answered, rebound, closed) changes nothing, whatever the engine still holds.
// @unchecked: loop-bound without `NIOLoopBound`: the driver is touched on its own loop only (the engine calls both
// methods there, as `DeliverySink` says; debug builds check it), and the sink keeps no copy of the loop (it is the
// driver's own): every open WebSocket has a sink, and stays small.
final class ConnectionSink: DeliverySink, @unchecked Sendable {
    private let driver: ConnectionDriver
    let generation: UInt32
    let isPersistent: Bool

    var eventLoop: any EventLoop { driver.eventLoop }

    init(driver: ConnectionDriver, generation: UInt32, isPersistent: Bool) {
        self.driver = driver
        self.generation = generation
        self.isPersistent = isPersistent
    }

    func deliver(_ events: CircularBuffer<WireEvent>) {
        driver.eventLoop.assertInEventLoop()
        driver.deliver(events, generation: generation)
    }

    func detached(_ reason: DetachReason) {
        driver.eventLoop.assertInEventLoop()
        driver.detached(reason, generation: generation)
    }
}
