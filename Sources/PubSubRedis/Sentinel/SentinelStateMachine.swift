import NIOCore

/// Where a Redis server listens.
public struct RedisEndpoint: Hashable, Sendable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// The decisions of Redis Sentinel discovery and failover, without sockets or clocks.
///
/// Discovery is a round over the sentinels, starting with the one that answered last: each is asked
/// `SENTINEL get-master-addr-by-name`; the first address given is then verified on a connection to it with
/// `ROLE` (a sentinel may still name a master that has just been demoted or killed). A node that is not a
/// master sends the next discovery to the next sentinel. A failover is noticed by a `+switch-master` message
/// from a sentinel, a `READONLY` error reply (the node was demoted), or a lost connection: the first two ask
/// for the connections to be dropped; every reconnect discovers the master again.
///
/// None of those reaches a node cut off from the sentinels but not from the old master, which goes on taking
/// writes the new one will never have. So the master followed is confirmed: every `confirmInterval` a
/// confirmation round asks the sentinels in turn, from the preferred one, until a majority of them (`quorum`)
/// named it. One sentinel is not enough: the one on the node's side of a partition still names the old master,
/// as it cannot fail over alone. A sentinel that names another master makes this one stale (the connections are
/// dropped, and the next discovery starts at that sentinel, its answer checked with `ROLE`); a master a majority
/// has not confirmed for `unconfirmedAfter` keeps the node not ready (`/readyz`).
struct SentinelStateMachine: MasterDiscovery {
    let sentinels: [RedisEndpoint]
    let masterName: String
    /// The last master verified with `ROLE`.
    private(set) var master: RedisEndpoint?
    /// The sentinel asked first in the next round.
    private(set) var preferred = 0
    /// Masters that replaced a verified one (failovers followed).
    private(set) var switches: UInt64 = 0
    /// The sentinel the pub/sub watcher (`+switch-master`) connects to next.
    private var watchNext = 0
    /// Which sentinel named each address (bounded), for the verdict on `ROLE`.
    private var namedBy: [RedisEndpoint: Int] = [:]
    private var round: DiscoveryRound?
    /// When a sentinel last named `master` (or it was verified).
    private(set) var confirmedAt: NIODeadline?
    private var confirmation: DiscoveryRound?
    /// The sentinels that named the master followed in the round running.
    private var confirmations = 0

    init(sentinels: [RedisEndpoint], masterName: String) {
        precondition(!sentinels.isEmpty, "at least one sentinel")
        self.sentinels = sentinels
        self.masterName = masterName
    }

    /// `ask`: send `SENTINEL get-master-addr-by-name` to that sentinel; `connect`: check with `ROLE` that the
    /// address is a master.
    typealias DiscoveryAction = MasterDiscoveryAction

    /// What a sentinel answered to `get-master-addr-by-name`.
    enum SentinelReply: Equatable {
        case master(RedisEndpoint)
        /// A null reply: this sentinel monitors no master of that name.
        case unknownName
        /// No connection, a timeout, an error reply.
        case failed(String)
    }

    /// Starts a discovery round.
    mutating func discover() -> DiscoveryAction {
        round = DiscoveryRound(count: sentinels.count, startingAt: preferred)
        return nextAsk()
    }

    private mutating func nextAsk() -> DiscoveryAction {
        guard var r = round else { return .fail("no discovery running") }
        guard let index = r.nextIndex() else {
            round = nil
            return .fail("no sentinel named a master '\(masterName)': " + r.failures.joined(separator: "; "))
        }
        round = r
        return .ask(server: index, sentinels[index])
    }

    mutating func sentinelAnswered(_ index: Int, _ reply: SentinelReply) -> DiscoveryAction {
        switch reply {
        case .master(let endpoint):
            round = nil
            namedBy[endpoint] = index
            if namedBy.count > 64 { namedBy = [endpoint: index] }
            return .connect(endpoint)
        case .unknownName:
            round?.failed("\(sentinels[index]) knows no master of that name")
            return nextAsk()
        case .failed(let reason):
            round?.failed("\(sentinels[index]): \(reason)")
            return nextAsk()
        }
    }

    /// `reject`: not a master (or unreachable); the next discovery starts at the next sentinel.
    typealias Verdict = MasterVerdict

    mutating func answered(_ index: Int, _ answer: SentinelReply) -> DiscoveryAction {
        sentinelAnswered(index, answer)
    }

    /// What `ROLE` said on a new connection to `endpoint`, judged with the sentinel that named it.
    mutating func checked(_ endpoint: RedisEndpoint, _ role: String?) -> Verdict {
        roleChecked(endpoint, named: namedBy[endpoint] ?? preferred, role: role)
    }

    /// A sentinel named the master a connection was just verified on (`checked` said `use`).
    mutating func verified(now: NIODeadline) {
        if master != nil { confirmedAt = now }
    }

    /// What `ROLE` said on a connection to `endpoint`, which sentinel `index` named (nil: no answer).
    mutating func roleChecked(_ endpoint: RedisEndpoint, named index: Int, role: String?) -> Verdict {
        guard role == "master" else {
            preferred = (index + 1) % sentinels.count
            return .reject
        }
        preferred = index
        let switched = master != nil && master != endpoint
        if switched { switches += 1 }
        master = endpoint
        return .use(switched: switched)
    }

    /// The connection to this master could not be made: the sentinel that named it is asked last next time.
    mutating func connectFailed(named index: Int) {
        preferred = (index + 1) % sentinels.count
    }

    enum Signal: Equatable {
        /// A sentinel announced a new master (`+switch-master <name> <old ip> <old port> <new ip> <new port>`).
        case switchMaster(name: String, to: RedisEndpoint)
        /// A write was refused with `READONLY`: the node serving it is a replica now.
        case readOnly
    }

    typealias Reaction = MasterReaction

    mutating func signal(_ signal: Signal) -> Reaction {
        switch signal {
        case .switchMaster(let name, let to):
            guard name == masterName, to != master else { return .ignore }
            return .rediscover
        case .readOnly:
            return .rediscover
        }
    }

    // MARK: Confirming the master followed

    enum ConfirmAction: Equatable {
        /// Ask this sentinel which master it names.
        case ask(server: Int, RedisEndpoint)
        /// A sentinel named the master followed.
        case confirmed
        /// Sentinel `by` names another master: drop the connections, discover again (from that sentinel).
        case stale(named: RedisEndpoint, by: RedisEndpoint)
        /// No sentinel answered this round; the reasons.
        case unconfirmed(String)
        /// No master is followed yet, or a round is running.
        case none
    }

    /// How many sentinels must name the master followed in one round: a majority of those configured.
    var quorum: Int { sentinels.count / 2 + 1 }

    /// Starts a confirmation round (every `confirmInterval`).
    mutating func confirm() -> ConfirmAction {
        guard master != nil, confirmation == nil else { return .none }
        confirmation = DiscoveryRound(count: sentinels.count, startingAt: preferred)
        confirmations = 0
        return nextConfirmation()
    }

    private mutating func nextConfirmation() -> ConfirmAction {
        guard var r = confirmation else { return .none }
        guard let index = r.nextIndex() else {
            confirmation = nil
            let named = "\(confirmations) of \(sentinels.count) sentinels named it, \(quorum) must"
            return .unconfirmed(([named] + r.failures).joined(separator: "; "))
        }
        confirmation = r
        return .ask(server: index, sentinels[index])
    }

    /// Sentinel `index` answered a confirmation round.
    mutating func confirmationAnswered(_ index: Int, _ reply: SentinelReply, now: NIODeadline) -> ConfirmAction {
        guard confirmation != nil else { return .none }
        switch reply {
        case .master(let endpoint) where endpoint == master:
            confirmations += 1
            if confirmations == 1 { preferred = index }
            guard confirmations >= quorum else { return nextConfirmation() }
            confirmation = nil
            confirmedAt = now
            return .confirmed
        case .master(let endpoint):
            confirmation = nil
            guard master != nil else { return .none }
            namedBy[endpoint] = index
            if namedBy.count > 64 { namedBy = [endpoint: index] }
            preferred = index
            return .stale(named: endpoint, by: sentinels[index])
        case .unknownName:
            confirmation?.failed("\(sentinels[index]) knows no master of that name")
            return nextConfirmation()
        case .failed(let reason):
            confirmation?.failed("\(sentinels[index]): \(reason)")
            return nextConfirmation()
        }
    }

    /// A sentinel named the master followed at most `within` ago; false when none is followed.
    func isConfirmed(now: NIODeadline, within: TimeAmount) -> Bool {
        guard master != nil, let confirmedAt else { return false }
        return now - confirmedAt <= within
    }

    /// The sentinel the `+switch-master` watcher connects to: each reconnect tries the next one.
    mutating func nextWatchedSentinel() -> RedisEndpoint {
        defer { watchNext = (watchNext + 1) % sentinels.count }
        return sentinels[watchNext]
    }

    /// Parses a `+switch-master` payload: `<name> <old ip> <old port> <new ip> <new port>`.
    static func parseSwitchMaster(_ text: String) -> (name: String, to: RedisEndpoint)? {
        let parts = text.split(separator: " ")
        guard parts.count == 5, let port = Int(parts[4]), (1...65535).contains(port) else { return nil }
        return (String(parts[0]), RedisEndpoint(host: String(parts[3]), port: port))
    }

    /// Parses a `get-master-addr-by-name` reply: `[ip, port]`, or null.
    static func parseMasterAddress(_ value: RESPValue) -> SentinelReply {
        if value.isNull { return .unknownName }
        if case .error(let message) = value { return .failed(message) }
        guard let parts = value.array, parts.count == 2, let host = parts[0].string,
            let port = parts[1].string.flatMap({ Int($0) }), (1...65535).contains(port)
        else { return .failed("unexpected reply \(value)") }
        return .master(RedisEndpoint(host: host, port: port))
    }

    /// The first element of a `ROLE` reply: `master`, `slave` or `sentinel`.
    static func parseRole(_ value: RESPValue) -> String? {
        value.array?.first?.string
    }
}
