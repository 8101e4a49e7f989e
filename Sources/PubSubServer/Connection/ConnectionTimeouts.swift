import NIOCore

/// How long a connection may sit without progress, and how a connection closed in the middle of a request is
/// wound down. A parked long-poll `/meta/connect`, an open EventSource stream and a WebSocket that answers pings
/// are never cut by these: they are requests in flight (or a live socket), not idle ones.
public struct ConnectionTimeouts: Sendable, Equatable {
    /// A request head not complete within this, counted from its first byte (from the connection's start for
    /// the first request), closes the connection: slow-header clients and half-done WebSocket upgrades.
    public var header: TimeAmount
    /// A keep-alive connection with no request in flight for this long is closed. While a request body is
    /// arriving, it is also the longest gap allowed between two reads.
    public var idle: TimeAmount
    /// A connection whose writes stay blocked (the channel not writable) for this long is closed: the peer is
    /// gone or never reads. The Bayeux session survives; it resumes on another connection or expires.
    public var send: TimeAmount
    /// Lingering close, after a response sent before the request was read (413, 400, 503): the output is
    /// closed and what the client still sends is read and dropped for at most `lingerTime` in all,
    /// `lingerReadTimeout` between two reads and `lingerBytes` bytes, so that the client reads the response
    /// instead of a reset. nginx's `lingering_time` and `lingering_timeout` (30 s and 5 s there).
    public var lingerTime: TimeAmount
    public var lingerReadTimeout: TimeAmount
    public var lingerBytes: Int

    public init(
        header: TimeAmount = .seconds(10),
        idle: TimeAmount = .seconds(30),
        send: TimeAmount = .seconds(30),
        lingerTime: TimeAmount = .seconds(10),
        lingerReadTimeout: TimeAmount = .seconds(2),
        lingerBytes: Int = 16 << 20
    ) {
        self.header = header
        self.idle = idle
        self.send = send
        self.lingerTime = lingerTime
        self.lingerReadTimeout = lingerReadTimeout
        self.lingerBytes = lingerBytes
    }
}
