/// A Bayeux error, rendered Faye's way: `<code>:<args joined by ",">:<message>`.
public struct BayeuxError: Error, Sendable, Hashable, CustomStringConvertible {
    public struct Code: Sendable, Hashable, RawRepresentable {
        public var rawValue: Int
        public var message: String

        public init(rawValue: Int) {
            self.rawValue = rawValue
            self.message = "Error"
        }

        public init(_ rawValue: Int, _ message: String) {
            self.rawValue = rawValue
            self.message = message
        }

        public static let versionMismatch = Code(300, "Version mismatch")
        public static let connectionTypeMismatch = Code(301, "Connection types not supported")
        public static let extensionMismatch = Code(302, "Extension mismatch")
        public static let badRequest = Code(400, "Bad request")
        public static let clientUnknown = Code(401, "Unknown client")
        public static let parameterMissing = Code(402, "Missing required parameter")
        public static let channelForbidden = Code(403, "Forbidden channel")
        public static let channelUnknown = Code(404, "Unknown channel")
        public static let channelInvalid = Code(405, "Invalid channel")
        public static let extensionUnknown = Code(406, "Unknown extension")
        public static let publishFailed = Code(407, "Failed to publish")
        /// The engine cannot tell whether the event was kept and delivered (`PublishUncertain`).
        public static let publishUncertain = Code(500, "Publish outcome unknown")
        public static let serverError = Code(500, "Internal server error")
        // Codes of our own, for limits Faye does not have.
        public static let queueOverflow = Code(409, "Queue overflow")
        public static let subscriptionLimit = Code(403, "Subscription limit reached")
        public static let channelTooLong = Code(405, "Channel name too long")
        public static let tooManyMessages = Code(413, "Too many messages in one request")
        public static let shuttingDown = Code(503, "Server shutting down")
    }

    public var code: Code
    public var args: [String]

    public init(_ code: Code, _ args: String...) {
        self.code = code
        self.args = args
    }

    public init(_ code: Code, args: [String]) {
        self.code = code
        self.args = args
    }

    public var description: String { "\(code.rawValue):\(args.joined(separator: ",")):\(code.message)" }

    public static func versionMismatch(_ args: String...) -> BayeuxError { .init(.versionMismatch, args: args) }
    public static func connectionTypeMismatch(_ args: [String]) -> BayeuxError {
        .init(.connectionTypeMismatch, args: args)
    }
    public static func clientUnknown(_ clientId: String) -> BayeuxError { .init(.clientUnknown, clientId) }
    public static func parameterMissing(_ name: String) -> BayeuxError { .init(.parameterMissing, name) }
    public static func channelForbidden(_ channel: String) -> BayeuxError { .init(.channelForbidden, channel) }
    public static func channelInvalid(_ channel: String) -> BayeuxError { .init(.channelInvalid, channel) }
    public static let badRequest = BayeuxError(.badRequest)
}
