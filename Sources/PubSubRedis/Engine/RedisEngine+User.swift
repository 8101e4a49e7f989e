import NIOCore
import PubSubCore

/// The session's user and grant live in the session's hash (`P c:<id>`, fields `user` and `grant`), so every node
/// reports the same user and enforces the same grant, and they go when the session's hash is deleted. The local session keeps a copy for a node that has
/// lost its connection to Redis.
extension RedisEngine {
    /// ARGV: id, field (`user` or `grant`), value. 1 set, 0 no such client.
    static let setSessionFieldScript = RedisScripts.Script(
        """
        local id = ARGV[3]
        if not redis.call('ZSCORE', P .. 'clients', id) then return 0 end
        redis.call('HSET', P .. 'c:' .. id, ARGV[4], ARGV[5])
        return 1
        """)

    public func setUser(_ clientId: String, user: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        let local = self.local.setUser(clientId, user: user, on: loop)
        guard isConnected else { return local }
        return eval(Self.setSessionFieldScript, [.string(clientId), "user", .string(user)]).map { _ in }.hop(to: loop)
    }

    public func user(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        guard isConnected else { return local.user(of: clientId, on: loop) }
        return field("user", of: clientId, on: loop) { self.local.user(of: clientId, on: loop) }
    }

    public func setGrant(_ clientId: String, grant: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        let local = self.local.setGrant(clientId, grant: grant, on: loop)
        guard isConnected else { return local }
        return eval(Self.setSessionFieldScript, [.string(clientId), "grant", .string(grant)]).map { _ in }.hop(to: loop)
    }

    public func grant(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        guard isConnected else { return local.grant(of: clientId, on: loop) }
        return field("grant", of: clientId, on: loop) { self.local.grant(of: clientId, on: loop) }
    }

    /// A field of the session's hash; when Redis has none (it lost its data in an outage and the session was
    /// registered again without it) or cannot be asked, this node's copy, if the session lives here.
    private func field(
        _ name: String, of clientId: String, on loop: any EventLoop,
        local: @escaping @Sendable () -> EventLoopFuture<String?>
    ) -> EventLoopFuture<String?> {
        commands.send(RESPCommand("HGET", .string(keyPrefix + "c:" + clientId), .string(name)))
            .hop(to: loop)
            .flatMap { value in value.isNull ? local() : loop.makeSucceededFuture(value.string) }
            .flatMapError { _ in local() }
    }
}
