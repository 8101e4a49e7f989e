import NIOCore

/// The life of a `RedisEngine`, without sockets or clocks: the phase a node is in, and what it must do on each
/// event of its two Redis connections. `RedisEngine` feeds it events under the lock of its state and performs
/// the actions it returns after unlocking.
///
/// A node serves notifications live only once both connections are up, its sessions and routing are back in
/// Redis, and the history has been read from the last position it delivered (filling). Until then notifications
/// are held, so that what the history gives and what arrives live merge in order. The command connection's loss
/// is an outage: the node serves its own clients only until Redis is back.
struct RedisEngineStateMachine: Sendable {
    /// What a node holds while it does not serve notifications live.
    struct Held: Equatable, Sendable {
        /// The notification channel is subscribed.
        var subscribed: Bool
        /// Notifications that arrived meanwhile (bounded by `bufferLimit`), handled in order after the fill.
        var buffered: [NodeMessage] = []
        /// The resident sessions when the notification connection was cut: the ones a gap can have cost events
        /// (`RedisEngine.tellGap`); a session that came later missed nothing of it. Kept from the first cut until
        /// a fill ends (a cut may come again meanwhile).
        var sessionsAtCut: Set<String>?
        /// What history reads that could not end the fill found (a connection dropped while they ran): added to
        /// what the read that ends it finds, so that no gap goes untold.
        var found = FillOutcome()

        init(subscribed: Bool) {
            self.subscribed = subscribed
        }
    }

    /// The command connection is down.
    struct Outage: Equatable, Sendable {
        var since: NIODeadline
        /// Publishes delivered to this node's subscribers only.
        var localPublishes: UInt64 = 0
    }

    /// What a history read found.
    struct FillOutcome: Equatable, Sendable {
        /// An event the history gave back, with its channel.
        struct Recovered: Equatable, Sendable {
            var channel: String
            var event: ByteBuffer
        }

        /// Events found in the history and delivered late.
        var recovered: UInt64 = 0
        /// Those events, in position order: delivered only once the fill ends, after the sessions of the cut
        /// were told of a gap, so that no event after a hole reaches a session before it is told of the hole.
        var events: [Recovered] = []
        /// Positions the history no longer held (an upper bound of what was missed).
        var missed: UInt64 = 0
        /// Redis lost its data (a new history epoch).
        var lostData = false

        mutating func add(_ other: FillOutcome) {
            recovered += other.recovered
            events += other.events
            missed += other.missed
            lostData = lostData || other.lostData
        }

        /// Sessions must be told they missed events.
        var isGap: Bool { missed > 0 || lostData }
    }

    enum Phase: Equatable, Sendable {
        /// Before the command connection first came up.
        case connecting(Held)
        /// The command connection is up: this node's sessions and routing are being written back to Redis.
        case routing(Held)
        /// Sessions and routing are in Redis; the history read waits for the notification channel to be
        /// subscribed, or for its retry after a failed read.
        case routed(Held)
        /// Both connections are up: the history read numbered `fill` runs.
        case filling(Held, fill: UInt64)
        /// Notifications are handled as they arrive.
        case serving
        /// The command connection is down: this node serves its own clients only.
        case outage(Outage, Held)
        case closed
        /// Only while a phase's data is changed in place (so that its buffer is not copied).
        case modifying
    }

    enum Action: Equatable, Sendable {
        case none
        /// Subscribe to this node's notification channel.
        case subscribe
        /// Write this node's sessions and routing back to Redis (it may have restarted empty, or changes made
        /// during the outage were local only); report the outage that ended, if one did.
        case route(after: Outage?)
        /// Read the history from the last delivered position; report with `fillFinished(fill, _:)`.
        case fill(UInt64)
        /// The read failed: call `fillDue()` after a pause.
        case scheduleFill
        /// Handle these notifications, in this order.
        case deliver([NodeMessage])
        /// The fill ended: count what it found, tell `sessionsAtCut` of a gap, then handle `buffered` in order.
        case resume(buffered: [NodeMessage], found: FillOutcome, sessionsAtCut: Set<String>)
        /// The notification connection was cut: connects can no longer be confirmed without Redis.
        case notificationsLost
        /// The command connection was lost: fail whatever waits on a notification; count the outage.
        case outageBegan
        /// Close both connections.
        case close
    }

    /// Notifications held beyond this number are dropped (the history gives the events among them back).
    static let bufferLimit = 1_000_000

    private(set) var phase: Phase = .connecting(Held(subscribed: false))
    private var fills: UInt64 = 0

    /// Notifications are handled as they arrive (both connections up, routed, filled).
    var isServing: Bool { phase == .serving }

    /// The notification channel is subscribed.
    var isSubscribed: Bool {
        switch phase {
        case .serving: return true
        case .connecting(let held), .routing(let held), .routed(let held), .filling(let held, _), .outage(_, let held):
            return held.subscribed
        case .closed, .modifying: return false
        }
    }

    /// The outage going on, if the command connection is down.
    var outage: Outage? {
        if case .outage(let outage, _) = phase { return outage }
        return nil
    }

    // MARK: The notification connection

    mutating func notificationsConnected() -> Action {
        phase == .closed ? .none : .subscribe
    }

    mutating func notificationsSubscribed() -> Action {
        if case .routed(var held) = phase {
            held.subscribed = true
            return startFill(held)
        }
        updateHeld { $0.subscribed = true }
        return .none
    }

    /// `resident`: the sessions on this node now.
    mutating func notificationsCut(resident: Set<String>) -> Action {
        switch phase {
        case .serving:
            phase = .routed(Held(subscribed: true))
        case .filling(let held, _):
            // The read running cannot end the fill: what was published until the new subscription may be
            // after what it read. The fill starts again once subscribed.
            phase = .modifying
            phase = .routed(held)
        case .connecting, .routing, .routed, .outage:
            break
        case .closed, .modifying:
            return .none
        }
        updateHeld { held in
            held.subscribed = false
            if held.sessionsAtCut == nil { held.sessionsAtCut = resident }
        }
        return .notificationsLost
    }

    /// A notification arrived on this node's channel.
    mutating func received(_ message: NodeMessage) -> Action {
        if phase == .serving { return .deliver([message]) }
        updateHeld { held in
            if held.buffered.count < Self.bufferLimit { held.buffered.append(message) }
        }
        return .none
    }

    // MARK: The command connection

    mutating func commandsConnected() -> Action {
        switch phase {
        case .connecting(let held):
            phase = .routing(held)
            return .route(after: nil)
        case .outage(let outage, let held):
            phase = .routing(held)
            return .route(after: outage)
        case .routing, .routed, .filling, .serving:
            return .route(after: nil)
        case .closed, .modifying:
            return .none
        }
    }

    /// The command connection was lost; `resident`: the sessions on this node now, the ones told of a gap the
    /// history read finds when the connection is back.
    mutating func commandsLost(now: NIODeadline, resident: Set<String>) -> Action {
        var held: Held
        switch phase {
        case .connecting(let h), .routing(let h), .routed(let h), .filling(let h, _), .outage(_, let h):
            held = h
        case .serving:
            held = Held(subscribed: true)
        case .closed, .modifying:
            return .none
        }
        if held.sessionsAtCut == nil { held.sessionsAtCut = resident }
        phase = .modifying
        phase = .outage(Outage(since: now), held)
        return .outageBegan
    }

    /// A publish made while Redis was unreachable.
    mutating func publishedLocally() {
        guard case .outage(var outage, let held) = phase else { return }
        outage.localPublishes += 1
        phase = .modifying
        phase = .outage(outage, held)
    }

    /// This node's sessions and routing are in Redis again.
    mutating func routingDone() -> Action {
        guard case .routing(let held) = phase else { return .none }
        if held.subscribed { return startFill(held) }
        phase = .modifying
        phase = .routed(held)
        return .none
    }

    // MARK: The history read

    /// The pause after a failed read is over.
    mutating func fillDue() -> Action {
        guard case .routed(let held) = phase, held.subscribed else { return .none }
        return startFill(held)
    }

    /// Read `fill` finished: what it found, or nil when it failed.
    mutating func fillFinished(_ fill: UInt64, _ outcome: FillOutcome?) -> Action {
        guard case .filling(var held, let current) = phase, current == fill else {
            // A read that a cut or an outage left behind: what it found is told when a fill ends.
            if let outcome { updateHeld { $0.found.add(outcome) } }
            return .none
        }
        phase = .modifying
        guard let outcome else {
            phase = .routed(held)
            return .scheduleFill
        }
        held.found.add(outcome)
        phase = .serving
        return .resume(buffered: held.buffered, found: held.found, sessionsAtCut: held.sessionsAtCut ?? [])
    }

    private mutating func startFill(_ held: Held) -> Action {
        fills += 1
        phase = .modifying
        phase = .filling(held, fill: fills)
        return .fill(fills)
    }

    /// Changes the data of a phase that holds notifications, in place; nothing in the other phases.
    private mutating func updateHeld(_ change: (inout Held) -> Void) {
        switch phase {
        case .connecting(var held):
            phase = .modifying
            change(&held)
            phase = .connecting(held)
        case .routing(var held):
            phase = .modifying
            change(&held)
            phase = .routing(held)
        case .routed(var held):
            phase = .modifying
            change(&held)
            phase = .routed(held)
        case .filling(var held, let fill):
            phase = .modifying
            change(&held)
            phase = .filling(held, fill: fill)
        case .outage(let outage, var held):
            phase = .modifying
            change(&held)
            phase = .outage(outage, held)
        case .serving, .closed, .modifying:
            break
        }
    }

    // MARK: Closing

    mutating func close() -> Action {
        if case .closed = phase { return .none }
        phase = .closed
        return .close
    }
}
