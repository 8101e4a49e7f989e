import NIOCore

extension MemoryEngine {
    public func setUser(_ clientId: String, user: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        withSession(clientId) { $0.user = user }
        return loop.makeSucceededVoidFuture()
    }

    public func user(of clientId: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        loop.makeSucceededFuture(withSession(clientId) { $0.user } ?? nil)
    }
}
