import NIOCore

/// Settings of the broker core. Every limit has a default that keeps a misbehaving client from hurting others.
public struct BrokerConfiguration: Sendable {
    /// How long a `/meta/connect` is held, and half the session lifetime (`2 × timeout`).
    public var timeout: TimeAmount
    /// The advised pause between the reply to one connect and the next connect.
    public var interval: TimeAmount
    /// Events waiting for one client; beyond it the client is dropped and told to handshake again.
    public var maxQueue: Int
    public var maxSubscriptionsPerClient: Int
    public var maxChannelLength: Int
    public var maxMessagesPerRequest: Int

    public init(
        timeout: TimeAmount = .seconds(45),
        interval: TimeAmount = .zero,
        maxQueue: Int = 1000,
        maxSubscriptionsPerClient: Int = 1000,
        maxChannelLength: Int = 256,
        maxMessagesPerRequest: Int = 1000
    ) {
        self.timeout = timeout
        self.interval = interval
        self.maxQueue = maxQueue
        self.maxSubscriptionsPerClient = maxSubscriptionsPerClient
        self.maxChannelLength = maxChannelLength
        self.maxMessagesPerRequest = maxMessagesPerRequest
    }

    var timeoutMilliseconds: Int64 { timeout.nanoseconds / 1_000_000 }
    var intervalMilliseconds: Int64 { interval.nanoseconds / 1_000_000 }
}
