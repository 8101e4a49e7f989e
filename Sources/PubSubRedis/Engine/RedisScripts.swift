import Crypto
import NIOCore

/// The Lua scripts of the Redis engine. Each runs atomically in Redis, so every change of shared state and the
/// notifications it causes are ordered with every publish: a node that learns of a change through its
/// notification channel has already received every event routed to it before that change, and none after.
///
/// Keys (prefix P, `pubsub:` by default):
/// - `P clients` sorted set: client id → expiry (ms since the Unix epoch)
/// - `P c:<id>` hash: `home` (the node holding its queue and connection), `connected` (1 after a connect)
/// - `P c:<id>:s` set: its subscriptions (names and patterns)
/// - `P i:<channel>` hash: node → how many of its sessions subscribe to `<channel>` (the routing table)
/// - `P ni:<node>` set: the channels a node has interest in (to repair the routing table after an outage)
/// - `P d:<id>`: the client was dropped for overflow (expires with the session lifetime)
/// - `P seq`, `P epoch`: the position counter and the history's epoch; `P history`: capped list of events
/// - `P gc`: the expiry sweep lock; `P alive:<node>`: a node's heartbeat (for operators: `KEYS pubsub:alive:*`)
/// Notification channel of a node: `C n:<node>` (C adds the database, as pub/sub ignores it).
enum RedisScripts {
    struct Script: Sendable {
        let source: String
        let sha: String

        init(_ body: String) {
            source = prelude + body
            let hex = Array("0123456789abcdef".utf8)
            sha = String(decoding: Insecure.SHA1.hash(data: Array(source.utf8)).flatMap { [hex[Int($0 >> 4)], hex[Int($0 & 15)]] },
                as: UTF8.self)
        }
    }

    /// ARGV[1] key prefix, ARGV[2] channel prefix; the script's own arguments follow.
    static let prelude = """
        local P, C = ARGV[1], ARGV[2]
        local function f(s) s = tostring(s) return #s .. ':' .. s end
        local function notify(node, msg) return redis.call('PUBLISH', C .. 'n:' .. node, msg) end
        local function interest(node, channel, delta)
          local key = P .. 'i:' .. channel
          local n = redis.call('HINCRBY', key, node, delta)
          if n <= 0 then
            redis.call('HDEL', key, node)
            redis.call('SREM', P .. 'ni:' .. node, channel)
          elseif n == delta then
            redis.call('SADD', P .. 'ni:' .. node, channel)
          end
        end
        local function missing(id)
          if redis.call('EXISTS', P .. 'd:' .. id) == 1 then return {2} end
          return {0}
        end

        """

    /// ARGV: id, node, expiry. 1 created, 0 id taken.
    static let create = Script("""
        local id, node = ARGV[3], ARGV[4]
        if redis.call('ZADD', P .. 'clients', 'NX', ARGV[5], id) == 0 then return 0 end
        redis.call('HSET', P .. 'c:' .. id, 'home', node, 'connected', '0')
        return 1
        """)

    /// A connect or attach on the session's home node. ARGV: id, node, expiry, refresh (1 for a connect).
    /// {1, connectedBefore} ok; {0} unknown; {2} dropped for overflow; {3} another node holds it now.
    static let touch = Script("""
        local id, node = ARGV[3], ARGV[4]
        if not redis.call('ZSCORE', P .. 'clients', id) then return missing(id) end
        local ck = P .. 'c:' .. id
        local state = redis.call('HMGET', ck, 'home', 'connected')
        if state[1] ~= node then return {3} end
        if ARGV[6] == '1' then
          redis.call('ZADD', P .. 'clients', 'XX', ARGV[5], id)
          redis.call('HSET', ck, 'connected', '1')
        end
        return {1, state[2] == '1' and 1 or 0}
        """)

    /// Moves a session to this node: routing moves with it, the node gets an `A` (adopt) notification with the
    /// subscriptions, and the old home an `M` (move) one, to which it answers with an `H` (handoff) of its queue.
    /// ARGV: id, node, expiry, refresh. {1, oldHome, oldAlive} or {0} / {2}.
    static let claim = Script("""
        local id, me = ARGV[3], ARGV[4]
        if not redis.call('ZSCORE', P .. 'clients', id) then return missing(id) end
        local ck = P .. 'c:' .. id
        local state = redis.call('HMGET', ck, 'home', 'connected')
        local old = state[1] or ''
        local subs = redis.call('SMEMBERS', ck .. ':s')
        if old ~= me then
          for _, ch in ipairs(subs) do
            if old ~= '' then interest(old, ch, -1) end
            interest(me, ch, 1)
          end
          redis.call('HSET', ck, 'home', me)
        end
        if ARGV[6] == '1' then
          redis.call('ZADD', P .. 'clients', 'XX', ARGV[5], id)
          redis.call('HSET', ck, 'connected', '1')
        end
        local parts = {'A', f(id), f(state[2] == '1' and '1' or '0'), f(#subs)}
        for _, ch in ipairs(subs) do parts[#parts + 1] = f(ch) end
        notify(me, table.concat(parts))
        local alive = 0
        if old ~= me and old ~= '' then
          -- PUBLISH answers how many connections received it: 0 means the old node is not listening.
          alive = notify(old, 'M' .. f(id) .. f(me))
        end
        return {1, old, alive}
        """)

    /// ARGV: id, maxSubscriptions, n, channel × n, then resume (1 or 0), epoch, sequence, maxQueue, ttl ms, now ms.
    /// The home node gets an `S` notification: the channels added, then the replayed events.
    /// {1, limitChannel or '', recovered, missed} or {0} / {2}.
    static let subscribe = Script("""
        local function matches(p, name)
          if p == name or p == '/**' then return true end
          if string.sub(p, -3) == '/**' then
            local pre = string.sub(p, 1, -3)
            return #name > #pre and string.sub(name, 1, #pre) == pre
          end
          if string.sub(p, -2) == '/*' then
            local pre = string.sub(p, 1, -2)
            if string.sub(name, 1, #pre) ~= pre then return false end
            local rest = string.sub(name, #pre + 1)
            return #rest > 0 and not string.find(rest, '/', 1, true)
          end
          return false
        end
        local function field(s, i)
          local colon = string.find(s, ':', i, true)
          local n = tonumber(string.sub(s, i, colon - 1))
          return string.sub(s, colon + 1, colon + n), colon + n + 1
        end
        local id = ARGV[3]
        if not redis.call('ZSCORE', P .. 'clients', id) then return missing(id) end
        local ck = P .. 'c:' .. id
        local home = redis.call('HGET', ck, 'home')
        local max, n = tonumber(ARGV[4]), tonumber(ARGV[5])
        local count = redis.call('SCARD', ck .. ':s')
        local subscribed, added, limit = {}, {}, ''
        for i = 1, n do
          local ch = ARGV[5 + i]
          if redis.call('SISMEMBER', ck .. ':s', ch) == 1 then
            subscribed[#subscribed + 1] = ch
          elseif count >= max then
            limit = ch
            break
          else
            redis.call('SADD', ck .. ':s', ch)
            count = count + 1
            interest(home, ch, 1)
            added[#added + 1] = ch
            subscribed[#subscribed + 1] = ch
          end
        end
        local parts = {'S', f(id), f(#added)}
        for _, ch in ipairs(added) do parts[#parts + 1] = f(ch) end
        local r = 6 + n
        local recovered, missed, events = 0, 0, {}
        if ARGV[r] == '1' then
          local tokenEpoch, tokenSeq = tonumber(ARGV[r + 1]), tonumber(ARGV[r + 2])
          local maxQueue, ttl, now = tonumber(ARGV[r + 3]), tonumber(ARGV[r + 4]), tonumber(ARGV[r + 5])
          local epoch = tonumber(redis.call('GET', P .. 'epoch') or '-1')
          local last = tonumber(redis.call('GET', P .. 'seq') or '0')
          if epoch == tokenEpoch and tokenSeq <= last then
            local entries = redis.call('LRANGE', P .. 'history', 0, -1)
            local first = last - #entries + 1
            local complete = tokenSeq + 1 >= first
            for _, entry in ipairs(entries) do
              local seq, i = field(entry, 1)
              seq = tonumber(seq)
              local ts, j = field(entry, i)
              local channel, k = field(entry, j)
              if seq > tokenSeq then
                if ttl > 0 and tonumber(ts) + ttl <= now then
                  complete = false
                else
                  for _, p in ipairs(subscribed) do
                    if matches(p, channel) then
                      events[#events + 1] = string.sub(entry, k)
                      break
                    end
                  end
                end
              end
            end
            missed = #events
            if complete and #events <= maxQueue then recovered = 1 else events = {} end
          end
        end
        parts[#parts + 1] = f(#events)
        for _, e in ipairs(events) do parts[#parts + 1] = f(e) end
        if #added > 0 or #events > 0 then notify(home, table.concat(parts)) end
        return {1, limit, recovered, missed}
        """)

    /// ARGV: id, n, channel × n. The home node gets a `U` notification. {1} or {0} / {2}.
    static let unsubscribe = Script("""
        local id = ARGV[3]
        if not redis.call('ZSCORE', P .. 'clients', id) then return missing(id) end
        local ck = P .. 'c:' .. id
        local home = redis.call('HGET', ck, 'home')
        local parts = {}
        for i = 1, tonumber(ARGV[4]) do
          local ch = ARGV[4 + i]
          if redis.call('SREM', ck .. ':s', ch) == 1 then
            interest(home, ch, -1)
            parts[#parts + 1] = f(ch)
          end
        end
        if #parts > 0 then notify(home, 'U' .. f(id) .. f(#parts) .. table.concat(parts)) end
        return {1}
        """)

    /// The body shared by destroy and the expiry sweep: removes every trace and tells the home node (`D`).
    static let destroyFunction = """
        local function destroy(id, reason, lifetime)
          local ck = P .. 'c:' .. id
          local home = redis.call('HGET', ck, 'home')
          for _, ch in ipairs(redis.call('SMEMBERS', ck .. ':s')) do
            if home then interest(home, ch, -1) end
          end
          redis.call('DEL', ck, ck .. ':s')
          redis.call('ZREM', P .. 'clients', id)
          if reason == 'overflow' then redis.call('SET', P .. 'd:' .. id, '1', 'PX', lifetime) end
          if home then notify(home, 'D' .. f(id) .. f(reason)) end
        end

        """

    /// ARGV: id, reason, lifetime ms. 1 destroyed, 0 did not exist.
    static let destroy = Script(destroyFunction + """
        local id = ARGV[3]
        if not redis.call('ZSCORE', P .. 'clients', id) then return 0 end
        destroy(id, ARGV[4], ARGV[5])
        return 1
        """)

    /// The expiry sweep, at most once per period for the whole cluster (the lock is never released: it expires).
    /// ARGV: node, now ms, period ms (0: no lock), batch. Returns the ids of the sessions expired (reported as
    /// session events by this node, the one that expired them), or -1 (lock taken).
    static let sweep = Script(destroyFunction + """
        local period = tonumber(ARGV[5])
        if period > 0 and not redis.call('SET', P .. 'gc', ARGV[3], 'NX', 'PX', period) then return -1 end
        local ids = redis.call('ZRANGEBYSCORE', P .. 'clients', '-inf', ARGV[4], 'LIMIT', 0, tonumber(ARGV[6]))
        for _, id in ipairs(ids) do destroy(id, 'expired', 0) end
        return ids
        """)

    /// Publishes one event: takes the next position, appends it to the history, and sends one `E` notification
    /// to each node with a subscriber. The event's bytes are `head .. position .. tail` (just `head` without
    /// history). ARGV: epoch candidate, history size, channel, head, tail, now ms, n, key × n.
    /// Returns {sequence, epoch}.
    static let publish = Script("""
        local function b36(n)
          local digits, s = '0123456789abcdefghijklmnopqrstuvwxyz', ''
          repeat
            local d = n % 36
            s = string.sub(digits, d + 1, d + 1) .. s
            n = (n - d) / 36
          until n == 0
          return s
        end
        redis.call('SET', P .. 'epoch', ARGV[3], 'NX')
        local epochText = redis.call('GET', P .. 'epoch')
        local epoch = tonumber(epochText)
        local size, channel = tonumber(ARGV[4]), ARGV[5]
        local seq = redis.call('INCR', P .. 'seq')
        local event = ARGV[6]
        if size > 0 then
          event = ARGV[6] .. '1.' .. b36(epoch) .. '.' .. b36(seq) .. ARGV[7]
          redis.call('RPUSH', P .. 'history', f(seq) .. f(ARGV[8]) .. f(channel) .. event)
          redis.call('LTRIM', P .. 'history', -size, -1)
        end
        local nodes, msg = {}, nil
        for i = 1, tonumber(ARGV[9]) do
          for _, node in ipairs(redis.call('HKEYS', P .. 'i:' .. ARGV[9 + i])) do
            if not nodes[node] then
              nodes[node] = true
              msg = msg or ('E' .. f(seq) .. f(channel) .. f(event))
              notify(node, msg)
            end
          end
        end
        return {seq, epochText}
        """)

    /// Reads the history after a sequence, for a node whose notifications were cut.
    /// ARGV: after, epoch candidate, the epoch `after` belongs to (another epoch: every entry is after it).
    /// Returns {epoch, last sequence, entries...}.
    static let history = Script("""
        redis.call('SET', P .. 'epoch', ARGV[4], 'NX')
        local epoch = redis.call('GET', P .. 'epoch')
        local last = tonumber(redis.call('GET', P .. 'seq') or '0')
        local entries = redis.call('LRANGE', P .. 'history', 0, -1)
        local first = last - #entries + 1
        local after = tonumber(ARGV[3])
        if epoch ~= ARGV[5] then after = 0 end
        local out = {epoch, last}
        for i = math.max(1, after - first + 2), #entries do out[#out + 1] = entries[i] end
        return out
        """)

    /// Puts a node's session back after an outage, unless another node holds it now.
    /// ARGV: id, node, expiry, n, channel × n. {1} registered, {0, home} held by another node now.
    static let register = Script("""
        local id, me = ARGV[3], ARGV[4]
        local ck = P .. 'c:' .. id
        local home = redis.call('HGET', ck, 'home')
        if home and home ~= me and redis.call('ZSCORE', P .. 'clients', id) then return {0, home} end
        redis.call('ZADD', P .. 'clients', ARGV[5], id)
        redis.call('HSET', ck, 'home', me, 'connected', '1')
        redis.call('DEL', ck .. ':s')
        for i = 1, tonumber(ARGV[6]) do redis.call('SADD', ck .. ':s', ARGV[6 + i]) end
        return {1}
        """)

    /// Rewrites a node's routing entries from its own sessions. ARGV: node, n, (channel, count) × n.
    static let reroute = Script("""
        local me = ARGV[3]
        local wanted = {}
        for i = 0, tonumber(ARGV[4]) - 1 do wanted[ARGV[5 + 2 * i]] = ARGV[6 + 2 * i] end
        for _, ch in ipairs(redis.call('SMEMBERS', P .. 'ni:' .. me)) do
          if not wanted[ch] then redis.call('HDEL', P .. 'i:' .. ch, me) end
        end
        redis.call('DEL', P .. 'ni:' .. me)
        for ch, count in pairs(wanted) do
          redis.call('HSET', P .. 'i:' .. ch, me, count)
          redis.call('SADD', P .. 'ni:' .. me, ch)
        end
        return 1
        """)

    static let all: [Script] = [create, touch, claim, subscribe, unsubscribe, destroy, sweep, publish, history, register, reroute]
}
