import NIOCore

extension MemoryEngine {
    public func setUser(_ clientId: String, user: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        withSession(clientId) { $0.user = user }
        return loop.makeSucceededVoidFuture()
    }

    public func user(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        loop.makeSucceededFuture(user(of: clientId))
    }

    /// The session's user, read at once (nil: no user, or no such session here).
    public func user(of clientId: String) -> String? {
        withSession(clientId) { $0.user } ?? nil
    }

    public func setGrant(_ clientId: String, grant: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        withSession(clientId) { $0.grant = grant }
        return loop.makeSucceededVoidFuture()
    }

    public func grant(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        loop.makeSucceededFuture(withSession(clientId) { $0.grant } ?? nil)
    }
}
