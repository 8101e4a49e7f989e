import NIOCore
import PubSubCore

/// The session's user lives in the session's hash (`P c:<id>`, field `user`), so every node reports the same
/// user, and it goes when the session's hash is deleted. The local session keeps a copy for a node that has
/// lost its connection to Redis.
extension RedisEngine {
    /// ARGV: id, user. 1 set, 0 no such client.
    static let setUserScript = RedisScripts.Script("""
        local id = ARGV[3]
        if not redis.call('ZSCORE', P .. 'clients', id) then return 0 end
        redis.call('HSET', P .. 'c:' .. id, 'user', ARGV[4])
        return 1
        """)

    public func setUser(_ clientId: String, user: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        let local = self.local.setUser(clientId, user: user, on: loop)
        guard isConnected else { return local }
        return eval(Self.setUserScript, [.string(clientId), .string(user)]).map { _ in }.hop(to: loop)
    }

    public func user(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        guard isConnected else { return local.user(of: clientId, on: loop) }
        return commands.send(RESPCommand("HGET", .string(keyPrefix + "c:" + clientId), "user"))
            .map { $0.isNull ? nil : $0.string }.hop(to: loop)
    }
}
