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
