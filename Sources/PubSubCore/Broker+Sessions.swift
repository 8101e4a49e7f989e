import Bayeux
import Logging
import NIOCore

/// The calls transports make about the sessions their connections carry, so that no transport reaches into the
/// engine itself.
extension Broker {
    /// Attaches a persistent sink without counting as a connect (an EventSource stream); false when the session
    /// does not exist.
    public func attach(_ clientId: String, sink: any DeliverySink, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        engine.attach(clientId, sink: sink, on: loop)
    }

    /// Detaches `sink` if it is still attached. With `takeEvents`, the waiting events are handed back (a parked
    /// poll whose hold ended); otherwise they stay queued for the next connection.
    @discardableResult
    public func detach(_ clientId: String, sink: any DeliverySink, takeEvents: Bool) -> CircularBuffer<WireEvent> {
        engine.detach(clientId, sink: sink, takeEvents: takeEvents)
    }

    /// Drops a client whose connection cannot keep up (more than `maxQueue` events wait on it): the session ends,
    /// counted as an overflow drop, and its next request is answered `409:<clientId>:Queue overflow` with
    /// `advice.reconnect: "handshake"`.
    @discardableResult
    public func drop(_ clientId: String, transport: ConnectionType, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        logDropped(clientId, transport: transport)
        return engine.destroyClient(clientId, reason: .overflow, on: loop)
    }

    /// Logs a slow consumer dropped for queue overflow (by its connection, or by the engine while attached).
    package func logDropped(_ clientId: String, transport: ConnectionType) {
        logger.info(
            "slow consumer dropped: queue overflow",
            metadata: ["pubsub.client.id": "\(clientId)", "pubsub.transport": "\(transport.rawValue)"])
    }
}
