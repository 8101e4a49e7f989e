/// What went wrong talking to Redis.
public struct RedisError: Error, Hashable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        enum Base: Hashable, Sendable {
            case notConnected, connectionClosed, timeout, server, protocolViolation, closed, notMaster, tls,
                notReplicated
        }
        let base: Base
        public static let notConnected = Code(base: .notConnected)
        public static let connectionClosed = Code(base: .connectionClosed)
        public static let timeout = Code(base: .timeout)
        /// Redis answered with an error reply.
        public static let server = Code(base: .server)
        /// A reply that makes no sense for the command.
        public static let protocolViolation = Code(base: .protocolViolation)
        /// The client was closed.
        public static let closed = Code(base: .closed)
        /// Sentinel mode: the server reached is not (or no longer) the master.
        public static let notMaster = Code(base: .notMaster)
        /// TLS could not be set up (a CA file that cannot be read).
        public static let tls = Code(base: .tls)
        /// A write the master took but fewer replicas than asked confirmed in time (`WAIT`).
        public static let notReplicated = Code(base: .notReplicated)
        public var description: String { "\(base)" }
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String = "") {
        self.code = code
        self.message = message
    }

    public var description: String { message.isEmpty ? "redis: \(code)" : "redis: \(code): \(message)" }
}
