import Bayeux
import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The server API's questions (`/api/channels`, `/api/presence`, `/api/history`, `/api/info`): asked per call,
/// never counted on the fan-out path. An engine that does not answer them serves the data path all the same;
/// the server API then answers these calls 501.
public protocol EngineQueries: Sendable {
    /// Every subscription name (patterns as subscribed) with at least one subscriber, and how many hold it.
    func channels(on loop: any EventLoop) -> EventLoopFuture<[ChannelSubscribers]>
    /// The clients subscribed to exactly `channel`.
    func presence(of channel: String, now: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<[PresenceEntry]>
    /// The held events of `channel` (a name or a pattern) after `since`, oldest first, at most `limit`.
    func history(of channel: String, since: String?, limit: Int, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<HistoryPage>
    /// Remembers the connection type of a session's latest connect, for presence; no-op when unchanged. The
    /// broker calls it on every successful connect; it is here because only presence and `/api/info` read it.
    func noteConnection(_ clientId: String, type: ConnectionType)
    /// This node's report beside the other nodes' (a clustered engine stores `local` for them, with its id).
    func nodes(local: NodeReport, on loop: any EventLoop) -> EventLoopFuture<[NodeReport]>
}

/// A subscription name (or pattern, as subscribed) and how many clients hold it.
public struct ChannelSubscribers: Sendable, Equatable {
    public var channel: String
    public var subscribers: Int

    public init(channel: String, subscribers: Int) {
        self.channel = channel
        self.subscribers = subscribers
    }
}

/// One client subscribed to a channel.
public struct PresenceEntry: Sendable, Equatable {
    public var clientId: String
    /// The identity an authentication mode established for the session; nil when there is none.
    public var user: String?
    /// The connection type of the session's latest connect; nil before its first connect.
    public var transport: String?
    /// When the session was created (its handshake), in milliseconds since the Unix epoch.
    public var sinceMilliseconds: Int64

    public init(clientId: String, user: String?, transport: String?, sinceMilliseconds: Int64) {
        self.clientId = clientId
        self.user = user
        self.transport = transport
        self.sinceMilliseconds = sinceMilliseconds
    }
}

/// What the history holds for a channel after a position.
public struct HistoryPage: Sendable {
    /// Held events, oldest first: their channel and the bytes subscribers got (`[{…}]`, with `ext.position`).
    public var events: [(channel: String, event: ByteBuffer)]
    /// True when every matching event after the position is in `events` or after it (`truncated`): the same
    /// promise as `ext.resume`'s `recovered`. False when the position is unknown, of another epoch, or older
    /// than what the history still holds (then `events` is what it holds, a lower bound).
    public var recovered: Bool
    /// More matching events follow: ask again from the position of the last one.
    public var truncated: Bool

    public init(events: [(channel: String, event: ByteBuffer)], recovered: Bool, truncated: Bool) {
        self.events = events
        self.recovered = recovered
        self.truncated = truncated
    }
}

/// What one node reports about itself for `GET /api/info`.
public struct NodeReport: Sendable, Equatable {
    public var id: String
    public var uptimeSeconds: Int64
    /// Sessions homed on the node.
    public var clients: Int
    /// Sessions by the connection type of their latest connect (sessions not yet connected are not counted).
    public var clientsByTransport: [String: Int]
    public var subscriptions: Int
    /// Per second, over the last sampling period.
    public var publishRate: Double
    public var deliveryRate: Double
    public var dropRate: Double

    public init(
        id: String, uptimeSeconds: Int64, clients: Int, clientsByTransport: [String: Int], subscriptions: Int,
        publishRate: Double = 0, deliveryRate: Double = 0, dropRate: Double = 0
    ) {
        self.id = id
        self.uptimeSeconds = uptimeSeconds
        self.clients = clients
        self.clientsByTransport = clientsByTransport
        self.subscriptions = subscriptions
        self.publishRate = publishRate
        self.deliveryRate = deliveryRate
        self.dropRate = dropRate
    }

    public var json: JSONValue {
        var byTransport = JSONObject()
        for key in clientsByTransport.keys.sorted() { byTransport[key] = JSONValue(clientsByTransport[key]!) }
        return .object([
            "id": .string(id),
            "uptimeSeconds": JSONValue(Int(uptimeSeconds)),
            "clients": .object(byTransport),
            "sessions": JSONValue(clients),
            "subscriptions": JSONValue(subscriptions),
            "rates": .object([
                "publishesPerSecond": Self.number(publishRate),
                "deliveriesPerSecond": Self.number(deliveryRate),
                "dropsPerSecond": Self.number(dropRate),
            ]),
        ])
    }

    public init?(json: JSONValue) {
        guard let o = json.objectValue, let id = o["id"]?.stringValue else { return nil }
        var byTransport: [String: Int] = [:]
        for (key, value) in o["clients"]?.objectValue?.entries ?? [] {
            byTransport[key] = Int(value.integerValue ?? 0)
        }
        let rates = o["rates"]?.objectValue
        self.init(
            id: id, uptimeSeconds: o["uptimeSeconds"]?.integerValue ?? 0,
            clients: Int(o["sessions"]?.integerValue ?? 0), clientsByTransport: byTransport,
            subscriptions: Int(o["subscriptions"]?.integerValue ?? 0),
            publishRate: rates?["publishesPerSecond"]?.doubleValue ?? 0,
            deliveryRate: rates?["deliveriesPerSecond"]?.doubleValue ?? 0,
            dropRate: rates?["dropsPerSecond"]?.doubleValue ?? 0)
    }

    static func number(_ value: Double) -> JSONValue {
        .number(String((value * 100).rounded() / 100))
    }
}

/// Wall-clock time, for answers that leave the process (the engine itself keeps monotonic deadlines).
package enum WallClock {
    /// Milliseconds since the Unix epoch now.
    package static func nowMilliseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }

    /// The wall-clock time of a monotonic deadline (`now` is the same instant on both clocks).
    package static func milliseconds(of deadline: NIODeadline, now: NIODeadline) -> Int64 {
        nowMilliseconds() - (now.uptimeNanoseconds.subtractingClamped(deadline.uptimeNanoseconds)) / 1_000_000
    }

    /// `2026-11-25T09:55:00.123Z`.
    package static func iso8601(milliseconds: Int64) -> String {
        let seconds = milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000
        let ms = Int(milliseconds - seconds * 1000)
        var days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let secondOfDay = Int(seconds - days * 86_400)
        // Civil from days (Howard Hinnant's algorithm).
        days += 719_468
        let era = (days >= 0 ? days : days - 146_096) / 146_097
        let doe = days - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let day = doy - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        let year = yoe + era * 400 + (month <= 2 ? 1 : 0)
        func pad(_ v: Int, _ n: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, n - s.count)) + s
        }
        return "\(pad(Int(year), 4))-\(pad(Int(month), 2))-\(pad(Int(day), 2))T\(pad(secondOfDay / 3600, 2)):"
            + "\(pad(secondOfDay / 60 % 60, 2)):\(pad(secondOfDay % 60, 2)).\(pad(ms, 3))Z"
    }
}

extension UInt64 {
    fileprivate func subtractingClamped(_ other: UInt64) -> Int64 {
        self >= other ? Int64(clamping: self - other) : -Int64(clamping: other - self)
    }
}

extension Advice {
    /// `{"reconnect":"none"}`: the client must not reconnect on its own (a session removed by the server API).
    package static let none: JSONValue = .object(["reconnect": "none"])
}

extension Message {
    /// Makes this connect reply say that the server ended the session and the client is not to come back on its
    /// own: it fails with `401:<clientId>:Unknown client`, loses its `clientId` and carries
    /// `advice: {reconnect: "none"}`.
    package mutating func mustNotReconnect(_ clientId: String) {
        fail(.clientUnknown(clientId))
        self.clientId = nil
        self["advice"] = Advice.none
    }
}
