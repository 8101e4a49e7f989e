import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

/// One connection of a session spread over shards: the sink it offered (a parked long poll, a WebSocket, an
/// EventSource stream) is attached to every shard through a proxy of its own, and this gathers what they do.
///
/// - A persistent sink gets every shard's deliveries as they come (in order per shard).
/// - A one-shot sink is answered once: the first delivery takes whatever the other shards hold for the session
///   (detaching their proxies), and a delivery another shard had already sent is put back at the front of that
///   shard's queue, for the next connect.
/// - Deliveries before the connect is answered wait here and go with its answer.
/// - The first detach (superseded, disconnected, expired, overflow, kicked, shutdown) is passed on once; the
///   other shards' proxies are detached.
// @unchecked: its state is guarded by the lock of `state`; `engine` is unowned (the engine outlives its fan-ins).
final class ShardFanIn: @unchecked Sendable {
    let clientId: String
    let sink: any DeliverySink
    /// The proxies while the fan-in stands for the connection (empty once it is done). Each proxy holds the
    /// fan-in for as long as a shard holds the proxy, so that a late delivery still finds its way back; the fan-in
    /// holds its proxies only in its state, which lets go of them when it is done (`takeProxies`). A second,
    /// constant strong list here would make a cycle that keeps every long-poll connect's fan-in, proxies and sink.
    var all: [Proxy] { state.withLockedValue { $0.proxies } }
    private unowned let engine: RedisShardedEngine

    enum Phase {
        /// The shards are being connected: deliveries wait in `pending`.
        case connecting
        /// Attached everywhere: deliveries go to the sink.
        case armed
        /// Answered (one-shot) or detached: nothing more reaches the sink.
        case done
    }

    private struct State {
        var phase = Phase.connecting
        var pending: [(shard: Int, events: CircularBuffer<WireEvent>)] = []
        /// Events in `pending`: past `limit` the client is dropped as a slow consumer, as a connection's backlog.
        var pendingCount = 0
        var proxies: [Proxy]
    }
    private let state: NIOLockedValueBox<State>

    /// The most events that may wait while the shards connect (`--max-queue` per shard).
    let limit: Int

    init(engine: RedisShardedEngine, clientId: String, sink: any DeliverySink, shards: Int) {
        self.engine = engine
        self.limit = engine.configuration.maxQueue * shards
        self.clientId = clientId
        self.sink = sink
        let proxies = (0..<shards).map { Proxy(shard: $0, sink: sink) }
        self.state = NIOLockedValueBox(State(proxies: proxies))
        for proxy in proxies { proxy.fanIn = self }
    }

    /// The proxies still to detach, once: the fan-in is done with them.
    func takeProxies() -> [Proxy] {
        state.withLockedValue { s in
            defer { s.proxies = [] }
            return s.proxies
        }
    }

    /// The sink each shard is given.
    // @unchecked: `fanIn` is set once, when the fan-in is made, before any shard holds the proxy; the rest is
    // immutable.
    final class Proxy: DeliverySink, @unchecked Sendable {
        let shard: Int
        let eventLoop: any EventLoop
        let isPersistent: Bool
        var fanIn: ShardFanIn?

        init(shard: Int, sink: any DeliverySink) {
            self.shard = shard
            self.eventLoop = sink.eventLoop
            self.isPersistent = sink.isPersistent
        }

        func deliver(_ events: CircularBuffer<WireEvent>) {
            guard let fanIn else { return }
            fanIn.delivered(events, from: shard)
        }

        func detached(_ reason: DetachReason) {
            fanIn?.detached(reason, from: shard)
        }
    }

    private func delivered(_ events: CircularBuffer<WireEvent>, from shard: Int) {
        enum Then {
            case forward
            case answer
            case putBack
            case wait
            case overflow
        }
        let then = state.withLockedValue { s -> Then in
            switch s.phase {
            case .connecting:
                s.pendingCount += events.count
                guard s.pendingCount <= limit else {
                    s.phase = .done
                    s.pending = []
                    return .overflow
                }
                s.pending.append((shard, events))
                return .wait
            case .armed:
                if sink.isPersistent { return .forward }
                s.phase = .done
                return .answer
            case .done:
                return .putBack
            }
        }
        switch then {
        case .forward:
            sink.deliver(events)
        case .answer:
            // One answer: this shard's events, then what the others hold.
            var all = events
            all.append(contentsOf: engine.detachProxies(of: self, except: shard, takeEvents: true))
            engine.forget(self)
            sink.deliver(all)
        case .putBack:
            engine.putBack(events, for: clientId, shard: shard)
        case .wait:
            break
        case .overflow:
            // Too much arrived while the shards connected: the session ends everywhere, as an overflow.
            _ = engine.detachProxies(of: self, except: nil, takeEvents: false)
            engine.forget(self)
            engine.overflowed([clientId], in: nil)
            sink.detached(.overflow)
        }
    }

    private func detached(_ reason: DetachReason, from shard: Int) {
        let first = state.withLockedValue { s -> Bool in
            guard s.phase != .done else { return false }
            s.phase = .done
            return true
        }
        guard first else { return }
        _ = engine.detachProxies(of: self, except: shard, takeEvents: false)
        engine.forget(self)
        engine.detachedEverywhere(clientId, reason: reason, from: shard)
        sink.detached(reason)
    }

    /// The connect is answered: what arrived meanwhile, and whether the fan-in now forwards (`armed`) or is done.
    /// A persistent sink is armed when `attach`; a one-shot one only when nothing arrived meanwhile either (else
    /// those events answer it now).
    func settle(attach: Bool) -> (events: CircularBuffer<WireEvent>, armed: Bool) {
        state.withLockedValue { s in
            var events = CircularBuffer<WireEvent>()
            for entry in s.pending { events.append(contentsOf: entry.events) }
            s.pending = []
            guard s.phase == .connecting else { return (events, false) }
            let armed = attach && (sink.isPersistent || events.isEmpty)
            s.phase = armed ? .armed : .done
            return (events, armed)
        }
    }

    /// Detached by the engine (a held poll that ended, a closed connection): no more deliveries.
    func close() -> CircularBuffer<WireEvent> {
        state.withLockedValue { s in
            s.phase = .done
            var events = CircularBuffer<WireEvent>()
            for entry in s.pending { events.append(contentsOf: entry.events) }
            s.pending = []
            return events
        }
    }

    var isArmed: Bool { state.withLockedValue { $0.phase == .armed } }
}
