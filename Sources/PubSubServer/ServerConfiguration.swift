import NIOCore
import PubSubCore

/// Settings of the network server.
public struct ServerConfiguration: Sendable {
    public var host: String
    public var port: Int
    /// The mount path, e.g. `/faye`: WebSocket, long-polling, JSON-P and EventSource all live under it.
    public var mount: String
    /// Largest HTTP request body (413 beyond it).
    public var maxRequestBytes: Int
    /// Largest WebSocket message (close 1009 beyond it).
    public var maxFrameBytes: Int
    /// Deepest JSON nesting accepted (HTTP 400, or an error reply on WebSocket, beyond it).
    public var maxJSONDepth: Int
    /// Bytes a connection may have waiting to be written: its write buffer's high water mark (the low one is
    /// half). Past it the connection stops being read and delivered events wait in its backlog, up to
    /// `broker.maxQueue` events, then the client is dropped.
    public var maxOutboundBytes: Int
    /// Every connection's kernel send buffer (`SO_SNDBUF`, which Linux doubles; autotuning is then off): what the
    /// kernel may hold of a reader that stopped reading. Kept small so that such a reader soon leaves the
    /// connection unwritable and `timeouts.send` applies, instead of hundreds of KB vanishing into an autotuned
    /// buffer; what it held unread goes out again on the session's next connection (`DeliveryLedger`).
    /// 0 leaves the kernel's default.
    public var socketSendBuffer: Int = 64 << 10
    public var broker: BrokerConfiguration
    public var extensions: ExtensionPipeline
    /// Event-loop threads; 0 means one per core.
    public var threads: Int
    /// TLS, systemd, metrics, connection and publish limits, drain.
    public var operations: OperationsConfiguration
    /// Header, idle and send timeouts, and the bounds of a lingering close.
    public var timeouts: ConnectionTimeouts
    /// A WebSocket silent for this long gets a ping (one silent for twice this is closed), and an EventSource
    /// stream a heartbeat (a comment line), so a peer that is gone is noticed.
    public var pingInterval: TimeAmount
    /// Web origins allowed to use CORS and WebSocket (`--allowed-origins`); default any, as Faye.
    public var origins = OriginPolicy()
    /// JSON-P callback-polling, which origins cannot protect (`--disable-callback-polling` turns it off).
    public var callbackPolling = true
    /// The key of the server API (`/api`) and the dashboard (`/admin`); nil leaves both off (404).
    public var apiKey: String?

    public init(
        host: String = "127.0.0.1",
        port: Int = 9292,
        mount: String = "/faye",
        maxRequestBytes: Int = 1 << 20,
        maxFrameBytes: Int = 1 << 20,
        maxJSONDepth: Int = 64,
        maxOutboundBytes: Int = 1 << 20,
        broker: BrokerConfiguration = .init(),
        extensions: ExtensionPipeline = .init(),
        threads: Int = 0,
        operations: OperationsConfiguration = .init(),
        timeouts: ConnectionTimeouts = .init(),
        pingInterval: TimeAmount = .seconds(30),
        apiKey: String? = nil
    ) {
        self.host = host
        self.port = port
        self.mount = mount
        self.maxRequestBytes = maxRequestBytes
        self.maxFrameBytes = maxFrameBytes
        self.maxJSONDepth = maxJSONDepth
        self.maxOutboundBytes = maxOutboundBytes
        self.broker = broker
        self.extensions = extensions
        self.threads = threads
        self.operations = operations
        self.timeouts = timeouts
        self.pingInterval = pingInterval
        self.apiKey = apiKey
    }

    /// Every connection's write buffer water marks: high at `maxOutboundBytes`, low at half of it.
    var writeBufferWaterMark: ChannelOptions.Types.WriteBufferWaterMark {
        let high = max(maxOutboundBytes, 2)
        return .init(low: high / 2, high: high)
    }

    /// The mount without a trailing slash ("" for "/").
    var normalizedMount: String {
        var m = mount.hasPrefix("/") ? mount : "/" + mount
        while m.hasSuffix("/") { m.removeLast() }
        return m
    }
}
