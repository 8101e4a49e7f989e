import Bayeux
import NIOConcurrencyHelpers
import NIOCore

/// The server API's questions, answered from the subscription index and the history as they are: each takes each
/// shard's lock (or the engine's, for the history) once for the question, and nothing is counted while publishing.
extension MemoryEngine: EngineQueries {
    public func channels(on loop: any EventLoop) -> EventLoopFuture<[ChannelSubscribers]> {
        var counts: [String: Int] = [:]
        for shard in shards {
            shard.lock.withLock {
                for (channel, subscribers) in shard.index { counts[channel, default: 0] += subscribers.count }
            }
        }
        return loop.makeSucceededFuture(counts.map { ChannelSubscribers(channel: $0.key, subscribers: $0.value) })
    }

    public func presence(of channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<[PresenceEntry]>
    {
        let found = shards.flatMap { shard in
            shard.lock.withLock {
                (shard.index[channel]?.values).map { $0.map { ($0.id, $0.user, $0.transport, $0.since) } } ?? []
            }
        }
        let entries = found.map { id, user, transport, since in
            PresenceEntry(
                clientId: id, user: user, transport: transport?.rawValue,
                sinceMilliseconds: WallClock.milliseconds(of: since ?? now, now: now))
        }
        return loop.makeSucceededFuture(entries)
    }

    public func noteConnection(_ clientId: String, type: ConnectionType) {
        noteConnectionChanged(clientId, type: type)
    }

    /// As `noteConnection`; true when the session exists and its connection type changed.
    @discardableResult
    package func noteConnectionChanged(_ clientId: String, type: ConnectionType) -> Bool {
        withSession(clientId) { session in
            guard session.transport != type else { return false }
            session.transport = type
            return true
        } ?? false
    }

    /// The sessions of this engine by the type of their latest connect, and the session count.
    package func clientsByTransport() -> (total: Int, byTransport: [String: Int]) {
        var counts: [String: Int] = [:]
        var total = 0
        for shard in shards {
            shard.lock.withLock {
                for session in shard.sessions.values {
                    if let type = session.transport { counts[type.rawValue, default: 0] += 1 }
                }
                total += shard.sessions.count
            }
        }
        return (total, counts)
    }

    /// `local` with this engine's sessions filled in.
    public func nodes(local: NodeReport, on loop: any EventLoop) -> EventLoopFuture<[NodeReport]> {
        loop.makeSucceededFuture([withSessions(local)])
    }

    /// `report` with the sessions of this engine (by transport) and its subscription count.
    package func withSessions(_ report: NodeReport) -> NodeReport {
        var report = report
        (report.clients, report.clientsByTransport) = clientsByTransport()
        report.subscriptions = statistics.subscriptions
        return report
    }

    /// Reads the history the way a resuming subscribe does (`replay`): the same token check, the same
    /// completeness test, so `recovered` means what `ext.resume.recovered` means.
    public func history(of channel: String, since: String?, limit: Int, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<HistoryPage>
    {
        func matches(_ name: String) -> Bool { Channel.matches(pattern: channel, name: name) }
        let page = lock.withLock { () -> HistoryPage in
            history.prune(now: now)
            guard history.isEnabled else { return HistoryPage(events: [], recovered: false, truncated: false) }
            let held: [History.Entry]
            let recovered: Bool
            if let since {
                guard let position = Position(token: since, key: positionKey), position.epoch == epoch else {
                    return HistoryPage(events: [], recovered: false, truncated: false)
                }
                if let entries = history.entries(after: position.sequence) {
                    held = Array(entries)
                    recovered = true
                } else {
                    held = history.entries.filter { $0.sequence > position.sequence }
                    recovered = false
                }
            } else {
                // From the start of this epoch: complete while the history has dropped nothing.
                held = Array(history.entries)
                recovered = history.entries(after: 0) != nil
            }
            var events: [(channel: String, event: ByteBuffer)] = []
            var truncated = false
            for entry in held where matches(entry.channel) {
                if events.count == limit {
                    truncated = true
                    break
                }
                events.append((entry.channel, entry.event.json))
            }
            return HistoryPage(events: events, recovered: recovered, truncated: truncated)
        }
        return loop.makeSucceededFuture(page)
    }
}

// MARK: Kicked clients

extension MemoryEngine {
    /// The status of a connect for a session that is not here; the lock of `clientId`'s shard is held.
    func missingStatus(_ clientId: String, in shard: Shard) -> ConnectResult.Status {
        shard.kickedClients.contains(clientId) ? .kicked : .unknownClient
    }

    /// Whether `clientId` was removed by the server API lately (within the last 10 000 kicks or so).
    package func wasKicked(_ clientId: String) -> Bool {
        let shard = shard(for: clientId)
        return shard.lock.withLock { shard.kickedClients.contains(clientId) }
    }
}
