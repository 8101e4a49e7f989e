import NIOCore

/// Finds the master the engine's connections must use, for Sentinel (`SentinelMonitor`) and Cluster
/// (`ClusterMonitor`): where to connect at each attempt, the check of each new connection before it is used,
/// and what a redirecting error reply (`READONLY`, `MOVED`) means.
protocol MasterLocator: AnyObject, Sendable {
    func resolve() -> EventLoopFuture<RedisEndpoint>
    /// Fails (the connection is dropped) unless the connection reached the master; `true` when that master
    /// replaced another one (a failover followed).
    func verify(_ endpoint: RedisEndpoint, send: @escaping RedisClient.Sender) -> EventLoopFuture<Bool>
    /// An error reply that made the client drop its connection.
    func redirected(_ message: String)
}

/// One round of asking servers in turn where the master is (sentinels, cluster nodes): each once, starting
/// with the one that answered last; the failures are kept for the message when none answers.
struct DiscoveryRound: Sendable {
    private let order: [Int]
    private var next = 0
    private(set) var failures: [String] = []

    init(count: Int, startingAt preferred: Int) {
        order = (0..<count).map { (preferred + $0) % count }
    }

    /// The index to ask next, or nil once every one was asked.
    mutating func nextIndex() -> Int? {
        guard next < order.count else { return nil }
        defer { next += 1 }
        return order[next]
    }

    mutating func failed(_ reason: String) {
        failures.append(reason)
    }
}
