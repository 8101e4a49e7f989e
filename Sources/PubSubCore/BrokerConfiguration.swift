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
    /// Published events kept for clients that resume after a reconnect; 0 turns history and positions off.
    public var historySize: Int
    /// How long an event stays in the history; nil: until the size limit pushes it out.
    public var historyTTL: TimeAmount?
    /// Bytes the history may hold (each event's encoded bytes plus its channel name, summed); the oldest go
    /// first. 0: bounded by `historySize` only. An event larger than this alone is delivered but not kept.
    public var historyBytes: Int
    /// WebSocket compression (permessage-deflate): events are compressed once per publish for the subscribers that
    /// negotiated it; nil turns it off (no 101 response then offers it).
    public var eventCompression: EventCompression?

    /// 64 MiB: 1000 events of 64 KiB, or 64 of 1 MiB.
    public static let defaultHistoryBytes = 64 << 20

    public init(
        timeout: TimeAmount = .seconds(45),
        interval: TimeAmount = .zero,
        maxQueue: Int = 1000,
        maxSubscriptionsPerClient: Int = 1000,
        maxChannelLength: Int = 256,
        maxMessagesPerRequest: Int = 1000,
        historySize: Int = 1000,
        historyTTL: TimeAmount? = nil,
        historyBytes: Int = BrokerConfiguration.defaultHistoryBytes,
        eventCompression: EventCompression? = EventCompression()
    ) {
        self.timeout = timeout
        self.interval = interval
        self.maxQueue = maxQueue
        self.maxSubscriptionsPerClient = maxSubscriptionsPerClient
        self.maxChannelLength = maxChannelLength
        self.maxMessagesPerRequest = maxMessagesPerRequest
        self.historySize = historySize
        self.historyTTL = historyTTL
        self.historyBytes = historyBytes
        self.eventCompression = eventCompression
    }

    var timeoutMilliseconds: Int64 { timeout.nanoseconds / 1_000_000 }
    var intervalMilliseconds: Int64 { interval.nanoseconds / 1_000_000 }
}
