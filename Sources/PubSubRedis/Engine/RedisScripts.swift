import Crypto
import NIOCore
import PubSubCore

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
/// - `P m:<channel>` set: the sessions subscribed to exactly `<channel>`; `P chans` hash: channel → how many
///   (the server API's index: presence and channel counts without reading every session; built from the sessions
///   by the first question when `P pidx` is missing, as after an upgrade, and kept by every script after that;
///   the first session of an empty Redis sets `P pidx`)
/// - `P d:<id>`: the client was dropped for overflow (expires with the session lifetime)
/// - `P seq`, `P epoch`, `P pkey`: the position counter, the history's epoch and the key of the position
///   permutation (`PositionCipher`; made with the epoch); `P history`: capped list of events,
///   `P hbytes`: the bytes it holds
/// - `P gc`: the expiry sweep lock; `P alive:<node>`: a node's heartbeat (for operators: `KEYS pubsub:alive:*`)
/// - `P node:<node>`: a node's report for the server API (expiring unless refreshed); `P nodes` set: the nodes
///   that have one
/// - Sentinel only: `P master` the address of the master the positions were last taken on, `P termbase` that
///   master's last position when the first node reached it (see `RedisEngine+Sentinel.swift`)
/// Notification channel of a node: `C n:<node>` (C adds the database, as pub/sub ignores it).
/// In Redis Cluster, P holds a hash tag (`{pubsub:}`), so every key and notification channel is in one slot:
/// each script runs where that slot is served, and notifications are sharded (`SPUBLISH`, `SSUBSCRIBE`).
enum RedisScripts {
    struct Script: Sendable {
        /// The script for one Redis server (notifications with `PUBLISH`).
        let plain: Variant
        /// The script for Redis Cluster: notifications with `SPUBLISH`, so they reach only the engine's shard.
        let sharded: Variant

        struct Variant: Sendable {
            let source: String
            let sha: String

            init(_ source: String) {
                self.source = source
                let hex = Array("0123456789abcdef".utf8)
                sha = String(
                    decoding: Insecure.SHA1.hash(data: Array(source.utf8)).flatMap {
                        [hex[Int($0 >> 4)], hex[Int($0 & 15)]]
                    },
                    as: UTF8.self)
            }
        }

        init(_ body: String) {
            let source = prelude + body
            plain = Variant(source)
            sharded = Variant(source.replacing("redis.call('PUBLISH'", with: "redis.call('SPUBLISH'"))
        }

        func variant(sharded: Bool) -> Variant { sharded ? self.sharded : plain }
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
        local function member(channel, id, delta)
          local key = P .. 'm:' .. channel
          if delta > 0 then
            if redis.call('SADD', key, id) == 1 then redis.call('HINCRBY', P .. 'chans', channel, 1) end
          elseif redis.call('SREM', key, id) == 1 then
            if redis.call('HINCRBY', P .. 'chans', channel, -1) <= 0 then redis.call('HDEL', P .. 'chans', channel) end
          end
        end
        local function missing(id)
          if redis.call('EXISTS', P .. 'd:' .. id) == 1 then return {2} end
          return {0}
        end

        """

    /// ARGV: id, node, expiry. {1, last sequence, epoch, position key} created (the handshake's position is
    /// then the cluster's latest, not this node's view of it, which may lag); {0} id taken.
    static let create = Script(
        """
        local id, node = ARGV[3], ARGV[4]
        -- No session yet: the server API's index is complete from here on (else the first question builds it).
        if redis.call('ZCARD', P .. 'clients') == 0 then redis.call('SET', P .. 'pidx', '1') end
        if redis.call('ZADD', P .. 'clients', 'NX', ARGV[5], id) == 0 then return {0} end
        redis.call('HSET', P .. 'c:' .. id, 'home', node, 'connected', '0')
        return {1, redis.call('GET', P .. 'seq') or '0', redis.call('GET', P .. 'epoch') or '',
          redis.call('GET', P .. 'pkey') or ''}
        """)

    /// A connect or attach on the session's home node. ARGV: id, node, expiry, refresh (1 for a connect).
    /// {1, connectedBefore} ok; {0} unknown; {2} dropped for overflow; {3} another node holds it now.
    static let touch = Script(
        """
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
    static let claim = Script(
        """
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

    /// `PositionCipher` in Lua: the same Feistel network over two 32-bit halves (Lua numbers are doubles, exact
    /// below 2^53, so a 64-bit value is always handled as `hi, lo`), and base 36 of `hi * 2^32 + lo` by long
    /// division. Golden-tested against the Swift implementation.
    static let positionFunctions = """
        local function prf(key, round, half)
          return tonumber(string.sub(redis.sha1hex(key .. string.char(48 + round) .. string.format('%08x', half)), 1, 8), 16)
        end
        local function xor32(a, b)
          local x = bit.bxor(a, b)
          if x < 0 then x = x + 4294967296 end
          return x
        end
        local function permute(key, hi, lo)
          for round = 0, \(PositionCipher.rounds - 1) do hi, lo = lo, xor32(hi, prf(key, round, lo)) end
          return hi, lo
        end
        local function unpermute(key, hi, lo)
          for round = \(PositionCipher.rounds - 1), 0, -1 do hi, lo = xor32(lo, prf(key, round, hi)), hi end
          return hi, lo
        end
        local function b36(hi, lo)
          local digits, s = '0123456789abcdefghijklmnopqrstuvwxyz', ''
          repeat
            local r = hi % 36
            hi = (hi - r) / 36
            local v = r * 4294967296 + lo
            local d = v % 36
            lo = (v - d) / 36
            s = string.sub(digits, d + 1, d + 1) .. s
          until hi == 0 and lo == 0
          return s
        end
        local function token(key, epoch, seq)
          local lo = seq % 4294967296
          return '\(Position.version).' .. b36(0, epoch) .. '.' .. b36(permute(key, (seq - lo) / 4294967296, lo))
        end

        """

    /// ARGV: id, maxSubscriptions, n, channel × n, then resume (1 or 0), the token's epoch and permuted sequence
    /// (as its 32-bit halves hi, lo: the key stays in Redis), maxQueue, ttl ms, now ms.
    /// The home node gets an `S` notification: the channels added, the replayed events, then, when recovered, the
    /// channels resumed.
    /// {1, limitChannel or '', recovered, missed, user or '', {channel added, ...}} or {0} / {2}.
    static let subscribe = Script(
        positionFunctions + """
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
                member(ch, id, 1)
                added[#added + 1] = ch
                subscribed[#subscribed + 1] = ch
              end
            end
            local parts = {'S', f(id), f(#added)}
            for _, ch in ipairs(added) do parts[#parts + 1] = f(ch) end
            local r = 6 + n
            local recovered, missed, events = 0, 0, {}
            if ARGV[r] == '1' then
              local tokenEpoch = tonumber(ARGV[r + 1])
              local maxQueue, ttl, now = tonumber(ARGV[r + 4]), tonumber(ARGV[r + 5]), tonumber(ARGV[r + 6])
              local epoch = tonumber(redis.call('GET', P .. 'epoch') or '-1')
              local key = redis.call('GET', P .. 'pkey')
              local last = tonumber(redis.call('GET', P .. 'seq') or '0')
              local tokenSeq = last + 1
              if key and epoch == tokenEpoch then
                local hi, lo = unpermute(key, tonumber(ARGV[r + 2]), tonumber(ARGV[r + 3]))
                tokenSeq = hi * 4294967296 + lo
              end
              if epoch == tokenEpoch and tokenSeq <= last then
                -- The history holds the sequences first..last in order: read only what comes after the token.
                -- Recovered only if every sequence after it is there (`prev` walks them), so a list with a hole
                -- (nodes configured differently) is answered honestly too.
                local first = last - redis.call('LLEN', P .. 'history') + 1
                local complete = tokenSeq + 1 >= first
                local entries = redis.call('LRANGE', P .. 'history', math.max(0, tokenSeq + 1 - first), -1)
                local prev = tokenSeq
                for _, entry in ipairs(entries) do
                  local seq, i = field(entry, 1)
                  seq = tonumber(seq)
                  local ts, j = field(entry, i)
                  local channel, k = field(entry, j)
                  if seq > tokenSeq then
                    if seq ~= prev + 1 then complete = false end
                    prev = seq
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
                if prev ~= last then complete = false end
                missed = #events
                if complete and #events <= maxQueue then recovered = 1 else events = {} end
              end
            end
            parts[#parts + 1] = f(#events)
            for _, e in ipairs(events) do parts[#parts + 1] = f(e) end
            if recovered == 1 then
              parts[#parts + 1] = f(#subscribed)
              for _, ch in ipairs(subscribed) do parts[#parts + 1] = f(ch) end
            end
            if #added > 0 or #events > 0 or recovered == 1 then notify(home, table.concat(parts)) end
            return {1, limit, recovered, missed, redis.call('HGET', ck, 'user') or '', added}
            """)

    /// ARGV: id, n, channel × n. The home node gets a `U` notification of the channels the session had.
    /// {1, user or '', {channel removed, ...}} or {0} / {2}.
    static let unsubscribe = Script(
        """
        local id = ARGV[3]
        if not redis.call('ZSCORE', P .. 'clients', id) then return missing(id) end
        local ck = P .. 'c:' .. id
        local home = redis.call('HGET', ck, 'home')
        local parts, removed = {}, {}
        for i = 1, tonumber(ARGV[4]) do
          local ch = ARGV[4 + i]
          if redis.call('SREM', ck .. ':s', ch) == 1 then
            interest(home, ch, -1)
            member(ch, id, -1)
            parts[#parts + 1] = f(ch)
            removed[#removed + 1] = ch
          end
        end
        if #parts > 0 then notify(home, 'U' .. f(id) .. f(#parts) .. table.concat(parts)) end
        return {1, redis.call('HGET', ck, 'user') or '', removed}
        """)

    /// The body shared by destroy and the expiry sweep: removes every trace and tells the home node (`D`).
    /// Returns the session's user ('' for none), for the session event.
    static let destroyFunction = """
        local function destroy(id, reason, lifetime)
          local ck = P .. 'c:' .. id
          local home = redis.call('HGET', ck, 'home')
          local user = redis.call('HGET', ck, 'user') or ''
          for _, ch in ipairs(redis.call('SMEMBERS', ck .. ':s')) do
            if home then interest(home, ch, -1) end
            member(ch, id, -1)
          end
          redis.call('DEL', ck, ck .. ':s')
          redis.call('ZREM', P .. 'clients', id)
          if reason == 'overflow' then redis.call('SET', P .. 'd:' .. id, '1', 'PX', lifetime) end
          if home then notify(home, 'D' .. f(id) .. f(reason)) end
          return user
        end

        """

    /// ARGV: id, reason, lifetime ms. {1, user} destroyed, {0} did not exist.
    static let destroy = Script(
        destroyFunction + """
            local id = ARGV[3]
            if not redis.call('ZSCORE', P .. 'clients', id) then return {0} end
            return {1, destroy(id, ARGV[4], ARGV[5])}
            """)

    /// The expiry sweep, at most once per period for the whole cluster (the lock is never released: it expires).
    /// ARGV: node, now ms, period ms (0: no lock), batch. Returns {id, user} of each session expired (reported
    /// as session events by this node, the one that expired them), or -1 (lock taken).
    static let sweep = Script(
        destroyFunction + """
            local period = tonumber(ARGV[5])
            if period > 0 and not redis.call('SET', P .. 'gc', ARGV[3], 'NX', 'PX', period) then return -1 end
            local ids = redis.call('ZRANGEBYSCORE', P .. 'clients', '-inf', ARGV[4], 'LIMIT', 0, tonumber(ARGV[6]))
            local expired = {}
            for i, id in ipairs(ids) do expired[i] = {id, destroy(id, 'expired', 0)} end
            return expired
            """)

    /// Publishes one event: takes the next position, appends it to the history, and sends one `E` notification
    /// to each node with a subscriber. The event's bytes are `head .. position .. tail` (just `head` without
    /// history). The history is trimmed from its oldest end while it holds more than `size` entries or more than
    /// `maxBytes` bytes (0: no byte bound); `P hbytes` keeps its byte total (summed when missing, as after an
    /// upgrade). An entry over `maxBytes` on its own is not kept, and nothing older is either.
    /// The position key (`P pkey`) is made beside the epoch, from the candidate, when Redis has none.
    /// ARGV: epoch candidate, key candidate, history size, max bytes, channel, head, tail, now ms, n, key × n.
    /// Returns {sequence, epoch, position key}.
    static let publish = Script(
        positionFunctions + """
            redis.call('SET', P .. 'epoch', ARGV[3], 'NX')
            redis.call('SET', P .. 'pkey', ARGV[4], 'NX')
            local epochText = redis.call('GET', P .. 'epoch')
            local key = redis.call('GET', P .. 'pkey')
            local size, maxBytes, channel = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
            local seq = redis.call('INCR', P .. 'seq')
            local event = ARGV[8]
            if size > 0 then
              event = ARGV[8] .. token(key, tonumber(epochText), seq) .. ARGV[9]
              local hk, bk = P .. 'history', P .. 'hbytes'
              local entry = f(seq) .. f(ARGV[10]) .. f(channel) .. event
              local bytes = redis.call('GET', bk)
              if bytes then
                bytes = tonumber(bytes)
              else
                bytes = 0
                for _, e in ipairs(redis.call('LRANGE', hk, 0, -1)) do bytes = bytes + #e end
              end
              if maxBytes > 0 and #entry > maxBytes then
                redis.call('DEL', hk)
                bytes = 0
              else
                local n = redis.call('RPUSH', hk, entry)
                bytes = bytes + #entry
                while n > size or (maxBytes > 0 and bytes > maxBytes) do
                  bytes = bytes - #redis.call('LPOP', hk)
                  n = n - 1
                end
              end
              redis.call('SET', bk, bytes)
            end
            local nodes, msg = {}, nil
            for i = 1, tonumber(ARGV[11]) do
              for _, node in ipairs(redis.call('HKEYS', P .. 'i:' .. ARGV[11 + i])) do
                if not nodes[node] then
                  nodes[node] = true
                  msg = msg or ('E' .. f(seq) .. f(channel) .. f(event))
                  notify(node, msg)
                end
              end
            end
            return {seq, epochText, key}
            """)

    /// Reads the history after a sequence, for a node whose notifications were cut.
    /// ARGV: after, epoch candidate, the epoch `after` belongs to (another epoch: every entry is after it),
    /// position key candidate. Returns {epoch, last sequence, position key, entries...}.
    static let history = Script(
        """
        redis.call('SET', P .. 'epoch', ARGV[4], 'NX')
        redis.call('SET', P .. 'pkey', ARGV[6], 'NX')
        local epoch = redis.call('GET', P .. 'epoch')
        local key = redis.call('GET', P .. 'pkey')
        local last = tonumber(redis.call('GET', P .. 'seq') or '0')
        local entries = redis.call('LRANGE', P .. 'history', 0, -1)
        local first = last - #entries + 1
        local after = tonumber(ARGV[3])
        if epoch ~= ARGV[5] then after = 0 end
        local out = {epoch, last, key}
        for i = math.max(1, after - first + 2), #entries do out[#out + 1] = entries[i] end
        return out
        """)

    /// Puts a node's session back after an outage, unless another node holds it now.
    /// ARGV: id, node, expiry, n, channel × n. {1, 1 if Redis still had it else 0} registered,
    /// {0, home} held by another node now.
    static let register = Script(
        """
        local id, me = ARGV[3], ARGV[4]
        local ck = P .. 'c:' .. id
        local home = redis.call('HGET', ck, 'home')
        local known = redis.call('ZSCORE', P .. 'clients', id)
        if home and home ~= me and known then return {0, home} end
        redis.call('ZADD', P .. 'clients', ARGV[5], id)
        redis.call('HSET', ck, 'home', me, 'connected', '1')
        for _, ch in ipairs(redis.call('SMEMBERS', ck .. ':s')) do member(ch, id, -1) end
        redis.call('DEL', ck .. ':s')
        for i = 1, tonumber(ARGV[6]) do
          redis.call('SADD', ck .. ':s', ARGV[6 + i])
          member(ARGV[6 + i], id, 1)
        end
        return {1, known and 1 or 0}
        """)

    /// Rewrites a node's routing entries from its own sessions. ARGV: node, n, (channel, count) × n.
    static let reroute = Script(
        """
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

    static let all: [Script] = [
        create, touch, claim, subscribe, unsubscribe, destroy, sweep, publish, history, register, reroute,
    ]
}
