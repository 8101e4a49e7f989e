import Bayeux
import NIOCore

/// Where a session's events go: a parked long-poll request (one-shot), a WebSocket or an EventSource stream
/// (persistent). The engine calls both methods on `eventLoop`.
public protocol DeliverySink: AnyObject, Sendable {
    var eventLoop: any EventLoop { get }
    /// A one-shot sink is detached by the delivery that answers it; a persistent one stays attached.
    var isPersistent: Bool { get }
    /// Encoded events (each a one-element JSON array, `[{…}]`) for the session this sink is attached to.
    func deliver(_ events: CircularBuffer<WireEvent>)
    /// The sink is no longer attached to its session.
    func detached(_ reason: DetachReason)
}

public enum DetachReason: Sendable, Equatable {
    /// Another connection of the same client took over.
    case superseded
    /// `/meta/disconnect`.
    case disconnected
    /// No `/meta/connect` for `2 × timeout`.
    case expired
    /// The client's queue overflowed: it has been dropped and must handshake again.
    case overflow
    /// The server is draining.
    case shutdown
    /// Removed by the server API (POST /api/disconnect).
    case kicked
}

public struct ConnectResult: Sendable {
    public enum Status: Sendable, Equatable {
        case ok
        case unknownClient
        /// The client was dropped because its queue overflowed.
        case overflowed
        /// The session was removed by the server API: the client must not reconnect on its own.
        case kicked
    }
    public var status: Status
    /// Events to send with (or, on a persistent sink, before) the connect reply.
    public var events: CircularBuffer<WireEvent>
    /// Whether the offered sink is now attached to the session.
    public var attached: Bool
    /// Whether the connect must be answered now: the first connect of a session, or events were waiting.
    public var answerNow: Bool
    /// The session's own copy of its id, when the engine keeps one: the held reply and the connection keep that
    /// string rather than the one parsed from each connect (a held connect lasts as long as the connection idles).
    public var clientId: String?

    public init(
        status: Status, events: CircularBuffer<WireEvent> = .noEvents, attached: Bool = false, answerNow: Bool = true
    ) {
        self.status = status
        self.events = events
        self.attached = attached
        self.answerNow = answerNow
    }
}

public enum SubscriptionResult: Sendable, Equatable {
    case ok
    case unknownClient
    case overflowed
    /// Channels before this one were subscribed; this one and those after it were not.
    case limitReached(String)
}

/// The answer to a subscribe that asked to resume from a position.
public struct ResumeResult: Sendable, Equatable {
    /// True when every matching event after the position was still held and has been queued, in order.
    public var recovered: Bool
    /// How many matching events were queued; when not recovered, how many are known to be missed (a lower bound).
    public var missed: Int

    public init(recovered: Bool, missed: Int) {
        self.recovered = recovered
        self.missed = missed
    }
}

/// Statistics every engine keeps, read by metrics and `STATUS=` lines.
public struct EngineStatistics: Sendable, Equatable {
    public var clients = 0
    public var subscriptions = 0
    public var channels = 0
    public var published: UInt64 = 0
    public var queued: UInt64 = 0
    public var overflowDrops: UInt64 = 0
    /// Events sent again because the connection they were handed to was lost before the client confirmed them.
    public var resent: UInt64 = 0
    public var expired: UInt64 = 0
    /// Events waiting in client queues now, summed over all sessions.
    public var queueDepth = 0
}

/// A publish the engine did not take, and did not deliver to anyone: a clustered engine cut off from its store
/// refuses rather than acknowledge what other nodes would never get. A Bayeux publisher gets
/// `407:<channel>:Failed to publish`, the server API a 503; either may publish again.
public struct PublishRefused: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String

    public init(reason: String) { self.reason = reason }

    public var description: String { reason }
}

/// A publish whose outcome the engine cannot know: its connection to the store broke before the store answered
/// (the event may have been kept and delivered, or not), or the store took and delivered it but fewer replicas
/// than asked confirmed it in time (a failover may lose it). Not acknowledged: a Bayeux publisher gets
/// `500:<channel>:Publish outcome unknown`, the server API a 503 with `reason`. Publishing again may deliver the
/// event twice.
public struct PublishUncertain: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String

    public init(reason: String) { self.reason = reason }

    public var description: String { reason }
}

/// The shared state of the broker: sessions, subscriptions and routing, that is the data path (handshake,
/// subscribe, connect, publish, detach). The memory engine serves one node; a clustered engine implements the same
/// calls over a shared store. Every call may complete later, so they return futures; the memory engine completes
/// them at once, and answers a publish (`publishing`) without a future at all.
///
/// What an engine may also do lives in protocols of its own, so that an engine (a composite over whole engines, a
/// future one) implements what it needs: `EngineQueries` answers the server API's questions (channels, presence,
/// history, nodes) and `EngineObservability` reports readiness and metrics of its own. The broker and the server
/// ask for them with `as?`, once, and do without: the API answers 501, readiness is the server's alone.
public protocol Engine: Sendable {
    /// A new session; `user` is the identity an authorization mode established at the handshake (nil: none), so
    /// the session (and its handshake event) has it from the start.
    func createClient(now: NIODeadline, user: String?, on loop: any EventLoop) -> EventLoopFuture<String>
    func clientExists(_ clientId: String, on loop: any EventLoop) -> EventLoopFuture<Bool>
    /// Refreshes the session's expiry and hands over waiting events. A one-shot `sink` is attached (parked) only
    /// when nothing is waiting and this is not the session's first connect; a persistent `sink` is always
    /// attached. Without a sink the waiting events are returned, unless a persistent sink already receives them.
    /// `receipt` is what the connect proves the client read (`DeliveryLedger`): on another connection than the
    /// session's, what it does not confirm goes out again first. A session that lost unconfirmed events to the
    /// ledger's bound is told so, as one dropped for overflow.
    func connect(
        _ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt, on loop: any EventLoop
    ) -> EventLoopFuture<ConnectResult>
    /// `connect`, answered at once by an engine that does not wait for anything (the memory engine). The
    /// default is `connect`'s future.
    func connecting(
        _ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt, on loop: any EventLoop
    ) -> Eventual<ConnectResult>
    /// A connect reply of the session is being written: what its connections were handed before it is one batch
    /// (`DeliveryLedger`). Returns the batch's number, which a client of CometD's acknowledgement extension
    /// acknowledges; nil for a session not held here.
    func closeBatch(_ clientId: String, connectId: JSONValue?) -> UInt64?
    /// Attaches a persistent sink without counting as a connect (EventSource streams).
    func attach(_ clientId: String, sink: any DeliverySink, on loop: any EventLoop) -> EventLoopFuture<Bool>
    /// Detaches `sink` if it is still attached. With `takeEvents`, the waiting events are handed back
    /// (a parked poll whose hold ended); otherwise they stay queued for the next connection.
    func detach(_ clientId: String, sink: any DeliverySink, takeEvents: Bool) -> CircularBuffer<WireEvent>
    /// Subscribes to `channels`. With `resume` (a position token), the events after it that match these
    /// channels are queued first, in their original order, if the history still holds all of them.
    func subscribe(_ clientId: String, to channels: [String], resume: String?, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<(SubscriptionResult, ResumeResult?)>
    func unsubscribe(_ clientId: String, from channels: [String], on loop: any EventLoop)
        -> EventLoopFuture<SubscriptionResult>
    /// Returns false when the client did not exist.
    func destroyClient(_ clientId: String, reason: DetachReason, on loop: any EventLoop) -> EventLoopFuture<Bool>
    /// Encodes the event once (with its `ext.position` when the history is on) and queues the same bytes for
    /// every subscriber of `channel` (one copy each, whatever the number of matching patterns). Completes with
    /// the event's position (nil without history). Fails with `PublishRefused` when the engine cannot keep the
    /// event (nothing was delivered: the publisher may send it again).
    func publish(_ event: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<String?>
    /// `publish`, answered at once by an engine that does not wait for anything (the memory engine). The
    /// default is `publish`'s future.
    func publishing(_ event: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> Eventual<String?>
    /// Records the user an authorization mode established for the session (JWT `sub`, the hook's handshake
    /// answer), so presence, webhooks, logs and metrics can report it. Does nothing for an unknown client.
    func setUser(_ clientId: String, user: String, on loop: any EventLoop) -> EventLoopFuture<Void>
    /// The session's user; nil when none was established or the client is unknown.
    func user(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?>
    /// Stores what an authorization mode granted the session at its handshake (a JWT's channels, publish
    /// patterns and expiry, as `SessionGrant.encoded`), so every node enforces the same grant.
    func setGrant(_ clientId: String, grant: String, on loop: any EventLoop) -> EventLoopFuture<Void>
    /// The session's stored grant; nil when none was stored or the client is unknown.
    func grant(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?>
    /// The position of the newest event, for a client that wants to start from "now"; nil without history.
    var position: String? { get }
    /// Removes sessions with no connect for `2 × timeout`.
    func sweep(now: NIODeadline)
    /// Detaches every sink with `.shutdown`.
    func shutdown()
    /// What the data path counted (sessions, subscriptions, publishes, deliveries, drops). Here and not in
    /// `EngineObservability`: the counts come from the data path itself, every engine has them, and more than
    /// metrics read them (the server API's rates, systemd's `STATUS=` line, a composite engine summing its parts).
    var statistics: EngineStatistics { get }
}

extension Engine {
    public func connecting(
        _ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, receipt: ConnectReceipt, on loop: any EventLoop
    ) -> Eventual<ConnectResult> {
        .later(connect(clientId, now: now, sink: sink, receipt: receipt, on: loop))
    }

    public func publishing(_ event: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> Eventual<String?>
    {
        .later(publish(event, to: channel, now: now, on: loop))
    }

    public func createClient(now: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<String> {
        createClient(now: now, user: nil, on: loop)
    }

    /// A connect that confirms every batch closed so far (a client with no message ids, tests).
    public func connect(_ clientId: String, now: NIODeadline, sink: (any DeliverySink)?, on loop: any EventLoop)
        -> EventLoopFuture<ConnectResult>
    {
        connect(clientId, now: now, sink: sink, receipt: ConnectReceipt(), on: loop)
    }
}

/// What a `/meta/connect` proves its client received (`DeliveryLedger`): the connect's `id` (a connect sent
/// again with the same id never got its reply) and, from a client of CometD's acknowledgement extension, the
/// number of the last batch it received (`ext.ack`).
public struct ConnectReceipt: Sendable, Equatable {
    public var connectId: JSONValue?
    public var ack: UInt64?

    public init(connectId: JSONValue? = nil, ack: UInt64? = nil) {
        self.connectId = connectId
        self.ack = ack
    }
}

extension CircularBuffer where Element == WireEvent {
    /// No events, as one shared storage: `[]` and `CircularBuffer()` allocate 16 slots each time, and every idle
    /// connection keeps such a value for as long as its connect is held. Appending to it copies first (copy on
    /// write), as appending to a fresh one-slot buffer would grow it.
    public static var noEvents: CircularBuffer<WireEvent> { SharedEvents.empty }
}

private enum SharedEvents {
    static let empty = CircularBuffer<WireEvent>(initialCapacity: 1)
}
