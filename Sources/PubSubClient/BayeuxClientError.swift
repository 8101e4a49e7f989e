/// Why a client operation failed. The `code` says what kind of failure it was; `message` is one line for people.
public struct BayeuxClientError: Error, Sendable, Hashable, CustomStringConvertible {
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        let name: String
        public var description: String { name }

        /// The URL cannot be used (bad syntax, or a scheme this client does not speak).
        public static let invalidURL = Code(name: "invalidURL")
        /// No connection could be made (refused, no route, name not resolved, connect timeout).
        public static let unreachable = Code(name: "unreachable")
        /// The server did not answer in time.
        public static let timeout = Code(name: "timeout")
        /// The connection closed before the answer arrived.
        public static let connectionClosed = Code(name: "connectionClosed")
        /// The server answered with an HTTP status other than 200.
        public static let httpStatus = Code(name: "httpStatus")
        /// The server kept answering 429 Too Many Requests after the allowed retries.
        public static let rateLimited = Code(name: "rateLimited")
        /// The server answered `successful: false`; `message` is its `error` string.
        public static let refused = Code(name: "refused")
        /// The server's answer was not Bayeux (not JSON, no reply to a message).
        public static let protocolError = Code(name: "protocolError")
        /// The operation needs a handshake first, or the client was closed.
        public static let notConnected = Code(name: "notConnected")
    }

    public var code: Code
    public var message: String
    /// The HTTP status, for `.httpStatus` and `.rateLimited`.
    public var status: Int?

    public init(_ code: Code, _ message: String, status: Int? = nil) {
        self.code = code
        self.message = message
        self.status = status
    }

    public var description: String { message }
}
