import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import PubSubCore

/// The server API's questions, answered for the whole cluster from what Redis holds: the subscription index
/// (`m:<channel>`: the sessions subscribed, `chans`: channel → how many) for channel counts and presence, with
/// the sessions' hashes for `user`, `transport` and `since`; the shared history; and each node's report
/// (`node:<id>`, refreshed by every `nodes` call). Nothing here runs while publishing.
extension RedisEngine: EngineQueries {
    /// A new session's handshake time, for presence on any node (not awaited: the handshake does not wait).
    func noteCreated(_ clientId: String, now: NIODeadline) {
        let since = milliseconds(now)
        commands.send(RESPCommand("HSET", .string(keyPrefix + "c:" + clientId), "since", .integer(since)))
            .whenFailure { _ in }
    }

    public func noteConnection(_ clientId: String, type: ConnectionType) {
        // Written when it changes only, so a long-polling client's connects cost Redis nothing more.
        guard local.noteConnectionChanged(clientId, type: type), isConnected else { return }
        commands.send(RESPCommand("HSET", .string(keyPrefix + "c:" + clientId), "transport", .string(type.rawValue)))
            .whenFailure { _ in }
    }

    public func channels(on loop: any EventLoop) -> EventLoopFuture<[ChannelSubscribers]> {
        guard isConnected else { return local.channels(on: loop) }
        return eval(RedisPresenceScripts.channels, []).map { reply -> [ChannelSubscribers] in
            let values = reply.array ?? []
            var out: [ChannelSubscribers] = []
            var i = 0
            while i + 1 < values.count {
                if let name = values[i].string, let count = values[i + 1].int, count > 0 {
                    out.append(ChannelSubscribers(channel: name, subscribers: Int(count)))
                }
                i += 2
            }
            return out
        }.hop(to: loop)
    }

    public func presence(of channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<[PresenceEntry]>
    {
        guard isConnected else { return local.presence(of: channel, now: now, on: loop) }
        let nowMilliseconds = milliseconds(now)
        return eval(RedisPresenceScripts.presence, [.string(channel)]).map { reply -> [PresenceEntry] in
            let values = reply.array ?? []
            var out: [PresenceEntry] = []
            var i = 0
            while i + 3 < values.count {
                if let id = values[i].string {
                    out.append(
                        PresenceEntry(
                            clientId: id, user: values[i + 1].string, transport: values[i + 2].string,
                            sinceMilliseconds: values[i + 3].int ?? nowMilliseconds))
                }
                i += 4
            }
            return out
        }.hop(to: loop)
    }

    /// The shared history read as a resuming subscribe reads it (same token check, same completeness and age
    /// tests), so `recovered` means what `ext.resume.recovered` means.
    public func history(of channel: String, since: String?, limit: Int, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<HistoryPage>
    {
        guard configuration.historySize > 0, isConnected else {
            return loop.makeSucceededFuture(HistoryPage(events: [], recovered: false, truncated: false))
        }
        // The token's sequence is permuted with the key Redis holds: undone with the key the node knows (to read
        // only what follows), else with the one the script returns (reading from the start).
        var parsed: (epoch: UInt64, permuted: UInt64)?
        var epochText = "-1"
        if let since {
            guard let token = Position.parse(since) else {
                return loop.makeSucceededFuture(HistoryPage(events: [], recovered: false, truncated: false))
            }
            parsed = token
            epochText = String(token.epoch)
        }
        let knownKey = state.withLockedValue { $0.positionKey }
        let readFrom =
            parsed.flatMap { token in knownKey.map { PositionCipher.unpermute(token.permuted, key: $0) } } ?? 0
        let ttl = configuration.historyTTL.map { $0.nanoseconds / 1_000_000 } ?? 0
        let nowMilliseconds = milliseconds(now)
        let arguments: [RESPArgument] = [
            // A token made with another key (another shard's, a forged one) unpermutes to any 64-bit number.
            .integer(Int64(clamping: readFrom)), .string(String(epochCandidate)), .string(epochText),
            .string(positionKeyCandidate),
        ]
        return eval(RedisScripts.history, arguments).map { [parsed, epochText] reply -> HistoryPage in
            guard let values = reply.array, values.count >= 3, let epoch = values[0].string,
                let last = values[1].int.map({ UInt64(max(0, $0)) }),
                let key = values[2].string.flatMap({ PositionKey(text: $0) })
            else { return HistoryPage(events: [], recovered: false, truncated: false) }
            let after = parsed.map { PositionCipher.unpermute($0.permuted, key: key) } ?? 0
            // A token of another epoch cannot be placed: nothing, as a resume answers it.
            if since != nil, epoch != epochText {
                return HistoryPage(events: [], recovered: false, truncated: false)
            }
            var complete = after <= last
            var firstHeld: UInt64?
            var events: [(channel: String, event: ByteBuffer)] = []
            var truncated = false
            for entry in values.dropFirst(3) {
                guard let buffer = entry.buffer else { continue }
                var reader = NodeMessage.Reader(buffer: buffer)
                guard let sequence = reader.integer(), let stamp = reader.field(), let name = reader.string(),
                    sequence > after
                else { continue }
                firstHeld = firstHeld ?? sequence
                if ttl > 0, let at = Int64(String(buffer: stamp)), at + ttl <= nowMilliseconds {
                    complete = false
                    continue
                }
                guard Channel.matches(pattern: channel, name: name) else { continue }
                if events.count == limit {
                    truncated = true
                    continue
                }
                events.append((name, reader.buffer))
            }
            if let firstHeld, firstHeld > after + 1 { complete = false }
            if firstHeld == nil, last > after { complete = false }
            return HistoryPage(events: events, recovered: complete, truncated: truncated)
        }.hop(to: loop)
    }

    /// Stores this node's report (expiring unless refreshed) and reads every live node's.
    public func nodes(local report: NodeReport, on loop: any EventLoop) -> EventLoopFuture<[NodeReport]> {
        var mine = local.withSessions(report)
        mine.id = node
        guard isConnected else { return loop.makeSucceededFuture([mine]) }
        let arguments: [RESPArgument] = [.string(node), .string(mine.json.jsonString), 10_000]
        return eval(RedisPresenceScripts.nodes, arguments).map { [mine] reply -> [NodeReport] in
            var reports = [mine]
            for value in reply.array ?? [] {
                guard let text = value.string, let json = try? JSONParser().parse(text),
                    let other = NodeReport(json: json), other.id != mine.id
                else { continue }
                reports.append(other)
            }
            return reports
        }.hop(to: loop)
    }
}

/// The server API's scripts (read-only but for a node's own report and the index they build or prune). Same calling convention as `RedisScripts`.
enum RedisPresenceScripts {
    /// Builds the index (`m:<channel>`, `chans`) from every session when it is missing (`pidx`), as after an
    /// upgrade from a version without it: once, O(sessions); every script keeps it after that.
    static let indexFunction = """
        local function indexed()
          if redis.call('EXISTS', P .. 'pidx') == 1 then return end
          for _, id in ipairs(redis.call('ZRANGE', P .. 'clients', 0, -1)) do
            for _, ch in ipairs(redis.call('SMEMBERS', P .. 'c:' .. id .. ':s')) do member(ch, id, 1) end
          end
          redis.call('SET', P .. 'pidx', '1')
        end

        """

    /// Every subscribed name and how many sessions hold it, from the index: O(channels). Returns {name, count, ...}.
    static let channels = RedisScripts.Script(
        indexFunction + """
            indexed()
            local out, all = {}, redis.call('HGETALL', P .. 'chans')
            for i = 1, #all, 2 do
              if tonumber(all[i + 1]) > 0 then
                out[#out + 1] = all[i]
                out[#out + 1] = tonumber(all[i + 1])
              end
            end
            return out
            """)

    /// The sessions subscribed to exactly ARGV[3]: {id, user or false, transport or false, since or false, ...},
    /// from the index: O(its subscribers). An entry whose session is gone or no longer holds the channel (left by
    /// a node of an older version) is dropped from the index here.
    static let presence = RedisScripts.Script(
        indexFunction + """
            indexed()
            local channel, out = ARGV[3], {}
            for _, id in ipairs(redis.call('SMEMBERS', P .. 'm:' .. channel)) do
              local ck = P .. 'c:' .. id
              if redis.call('SISMEMBER', ck .. ':s', channel) == 1 and redis.call('ZSCORE', P .. 'clients', id) then
                local h = redis.call('HMGET', ck, 'user', 'transport', 'since')
                out[#out + 1] = id
                out[#out + 1] = h[1]
                out[#out + 1] = h[2]
                out[#out + 1] = h[3]
              else
                member(channel, id, -1)
              end
            end
            return out
            """)

    /// Stores ARGV[4] as node ARGV[3]'s report for ARGV[5] ms and returns every node's report. Every node runs it
    /// once a second (with an API key): the nodes are a set of their own (`nodes`), so it reads O(nodes) keys, never
    /// the keyspace; a node whose report expired is taken out of the set here.
    static let nodes = RedisScripts.Script(
        """
        redis.call('SET', P .. 'node:' .. ARGV[3], ARGV[4], 'PX', ARGV[5])
        redis.call('SADD', P .. 'nodes', ARGV[3])
        local out = {}
        for _, id in ipairs(redis.call('SMEMBERS', P .. 'nodes')) do
          local v = redis.call('GET', P .. 'node:' .. id)
          if v then out[#out + 1] = v else redis.call('SREM', P .. 'nodes', id) end
        end
        return out
        """)
}

// MARK: Kicked clients

extension RedisEngine {
    /// Remembers a kick for the session's lifetime (`k:<id>`), so a connect on any node is told not to reconnect.
    /// Sent before the destroy on the same connection: a connect after the kick's answer finds it.
    func rememberKicked(_ clientId: String) {
        guard isConnected else { return }
        commands.send(
            RESPCommand(
                "SET", .string(keyPrefix + "k:" + clientId), "1", "PX", .integer(max(lifetimeMilliseconds, 1000)))
        ).whenFailure { _ in }
    }

    /// A connect for a session that is not (or no longer) anywhere: `.kicked` when the server API removed it.
    func refusedConnect(_ clientId: String, status: ConnectResult.Status, on loop: any EventLoop)
        -> EventLoopFuture<ConnectResult>
    {
        guard status == .unknownClient else { return loop.makeSucceededFuture(ConnectResult(status: status)) }
        if local.wasKicked(clientId) { return loop.makeSucceededFuture(ConnectResult(status: .kicked)) }
        guard isConnected else { return loop.makeSucceededFuture(ConnectResult(status: status)) }
        return commands.send(RESPCommand("EXISTS", .string(keyPrefix + "k:" + clientId))).map {
            ConnectResult(status: $0.int == 1 ? .kicked : .unknownClient)
        }.recover { _ in ConnectResult(status: .unknownClient) }.hop(to: loop)
    }
}
