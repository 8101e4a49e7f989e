import NIOCore

/// Which node serves the engine's slot, without sockets or clocks.
///
/// Discovery is a round over the known nodes (the seeds first, then the nodes the slot maps named), starting
/// with the one that answered last: each is asked `CLUSTER SLOTS`, and the master it gives for the slot is then
/// checked on a connection of its own (`ROLE` is master, and a key of the slot is served there, not `MOVED`).
/// A `MOVED` reply names the new owner, which the next discovery tries first. A failover is noticed by a
/// `MOVED` or `READONLY` reply, a `sunsubscribe` of the notification channel (its slot moved), or a lost
/// connection; every reconnect discovers the owner again.
struct ClusterStateMachine: MasterDiscovery {
    let seeds: [RedisEndpoint]
    let slot: Int
    /// Seeds, then the nodes learnt from slot maps (bounded).
    private(set) var known: [RedisEndpoint]
    /// The last owner verified.
    private(set) var master: RedisEndpoint?
    /// Owners that replaced a verified one (failovers or migrations followed).
    private(set) var switches: UInt64 = 0
    /// The node asked first in the next round.
    private var preferred = 0
    /// Where a `MOVED` said the slot is: tried before asking anyone.
    private var hint: RedisEndpoint?
    private var round: DiscoveryRound?

    static let maxKnown = 64

    init(seeds: [RedisEndpoint], slot: Int) {
        precondition(!seeds.isEmpty, "at least one node")
        self.seeds = seeds
        self.known = seeds
        self.slot = slot
    }

    /// `ask`: send `CLUSTER SLOTS` to that node of `known`; `connect`: verify the address serves the slot as a
    /// master.
    typealias DiscoveryAction = MasterDiscoveryAction

    enum NodeReply: Equatable {
        case slots(ClusterSlotMap)
        /// No connection, a timeout, an error reply (a node not in cluster mode says so here).
        case failed(String)
    }

    mutating func discover() -> DiscoveryAction {
        if let hint {
            self.hint = nil
            round = nil
            return .connect(hint)
        }
        round = DiscoveryRound(count: known.count, startingAt: preferred)
        return nextAsk()
    }

    private mutating func nextAsk() -> DiscoveryAction {
        guard var r = round else { return .fail("no discovery running") }
        guard let index = r.nextIndex() else {
            round = nil
            return .fail("no cluster node named the master of slot \(slot): " + r.failures.joined(separator: "; "))
        }
        round = r
        return .ask(server: index, known[index])
    }

    mutating func nodeAnswered(_ index: Int, _ reply: NodeReply) -> DiscoveryAction {
        switch reply {
        case .slots(let map):
            for node in map.nodes where !known.contains(node) && known.count < Self.maxKnown {
                known.append(node)
            }
            guard let owner = map.master(of: slot) else {
                round?.failed("\(known[index]): slot \(slot) is not served (the cluster is incomplete)")
                return nextAsk()
            }
            preferred = index
            round = nil
            return .connect(owner)
        case .failed(let reason):
            round?.failed("\(known[index]): \(reason)")
            return nextAsk()
        }
    }

    /// `reject`: not a master of the slot; the next discovery asks the next node first.
    typealias Verdict = MasterVerdict

    /// What the check of a new connection found: its `ROLE`, whether a key of the slot is served there, and the
    /// owner a `MOVED` named instead.
    struct Check: Equatable, Sendable {
        var role: String?
        var serves: Bool
        var movedTo: RedisEndpoint?
    }

    mutating func answered(_ index: Int, _ answer: NodeReply) -> DiscoveryAction {
        nodeAnswered(index, answer)
    }

    mutating func checked(_ endpoint: RedisEndpoint, _ check: Check) -> Verdict {
        verified(endpoint, role: check.role, serves: check.serves, movedTo: check.movedTo)
    }

    /// What a new connection to `endpoint` said: its `ROLE`, and whether it served a key of the slot
    /// (`moved`: the owner it named instead, if it did).
    mutating func verified(_ endpoint: RedisEndpoint, role: String?, serves: Bool, movedTo: RedisEndpoint? = nil)
        -> Verdict
    {
        guard role == "master", serves else {
            if let movedTo, movedTo != endpoint { hint = movedTo }
            preferred = (preferred + 1) % known.count
            return .reject
        }
        let switched = master != nil && master != endpoint
        if switched { switches += 1 }
        master = endpoint
        return .use(switched: switched)
    }

    enum Signal: Equatable {
        /// A reply `MOVED <slot> <host:port>`.
        case moved(slot: Int, to: RedisEndpoint)
        /// A write refused with `READONLY` (the node is a replica now).
        case readOnly
        /// The server unsubscribed the notification channel itself (its slot moved away).
        case unsubscribed
    }

    typealias Reaction = MasterReaction

    mutating func signal(_ signal: Signal) -> Reaction {
        switch signal {
        case .moved(let movedSlot, let to):
            guard movedSlot == slot else { return .ignore }
            hint = to
            return .rediscover
        case .readOnly, .unsubscribed:
            return .rediscover
        }
    }

    /// How long to wait before sending again a command that failed with `error`, or nil not to. `ASK` and
    /// `TRYAGAIN` (the slot is being migrated), `MOVED` (it was; the commands connection is following it) and
    /// `CLUSTERDOWN` say the command did not run; so does `notConnected` after one of them (the connection is
    /// being made again). The engine's scripts touch many keys of the slot, so `ASK` is not followed to the target
    /// (which may not hold them all yet): the script waits until the migration is over. Delays double from
    /// 10 ms to 500 ms; after 10 attempts (about 3 s) the error stands.
    static func retryDelay(after error: any Error, attempt: Int) -> TimeAmount? {
        guard attempt < 10, let e = error as? RedisError else { return nil }
        let retryable: Bool
        switch e.code {
        case .server:
            retryable = ["ASK ", "TRYAGAIN", "MOVED ", "CLUSTERDOWN"].contains { e.message.hasPrefix($0) }
        case .notConnected:
            retryable = attempt > 0
        default:
            retryable = false
        }
        guard retryable else { return nil }
        return .milliseconds(min(500, 10 << Int64(attempt)))
    }

    /// Parses `MOVED 4003 127.0.0.1:7101` (also `ASK …`): the slot and where it is.
    static func parseRedirect(_ message: String) -> (slot: Int, to: RedisEndpoint)? {
        let parts = message.split(separator: " ")
        guard parts.count == 3, parts[0] == "MOVED" || parts[0] == "ASK", let slot = Int(parts[1]),
            (0..<ClusterSlot.count).contains(slot), let colon = parts[2].lastIndex(of: ":"),
            let port = Int(parts[2][parts[2].index(after: colon)...]), (1...65535).contains(port)
        else { return nil }
        var host = String(parts[2][..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { return nil }
        return (slot, RedisEndpoint(host: host, port: port))
    }
}

/// What `CLUSTER SLOTS` said: slot ranges and the master serving each (replicas are not used).
struct ClusterSlotMap: Equatable, Sendable {
    struct Range: Equatable, Sendable {
        var first: Int
        var last: Int
        var master: RedisEndpoint
        var replicas: [RedisEndpoint]
    }
    var ranges: [Range]

    func master(of slot: Int) -> RedisEndpoint? {
        ranges.first { $0.first <= slot && slot <= $0.last }?.master
    }

    /// Every node named, masters first.
    var nodes: [RedisEndpoint] {
        var seen: [RedisEndpoint] = []
        for node in ranges.map(\.master) + ranges.flatMap(\.replicas) where !seen.contains(node) { seen.append(node) }
        return seen
    }

    /// Parses the reply; a node whose address is empty or `?` is the one asked (`askedHost`).
    static func parse(_ value: RESPValue, askedHost: String) -> ClusterSlotMap? {
        guard let entries = value.array else { return nil }
        var ranges: [Range] = []
        for entry in entries {
            guard let parts = entry.array, parts.count >= 3, let first = parts[0].int.map(Int.init),
                let last = parts[1].int.map(Int.init),
                0 <= first, first <= last, last < ClusterSlot.count
            else { return nil }
            var servers: [RedisEndpoint] = []
            for server in parts.dropFirst(2) {
                guard let fields = server.array, fields.count >= 2, let port = fields[1].int.map(Int.init),
                    (1...65535).contains(port)
                else { return nil }
                var host = fields[0].string ?? ""
                if host.isEmpty || host == "?" { host = askedHost }
                servers.append(RedisEndpoint(host: host, port: port))
            }
            ranges.append(Range(first: first, last: last, master: servers[0], replicas: Array(servers.dropFirst())))
        }
        return ClusterSlotMap(ranges: ranges)
    }
}
