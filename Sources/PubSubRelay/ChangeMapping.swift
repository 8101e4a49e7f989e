import Bayeux
import Crypto

/// One message for the broker.
public struct RelayMessage: Sendable, Equatable {
    public var channel: String
    public var data: JSONValue
    /// The deterministic idempotency key, also found in `data.key`.
    public var key: String

    public init(channel: String, data: JSONValue, key: String) {
        self.channel = channel
        self.data = data
        self.key = key
    }
}

/// Turns a change into the channels and `data` subscribers see:
/// `<prefix>/<collection…>/<escaped id>` with `{"id", "op", "seq", "key", "collection", "source", …, "doc"?}`,
/// or, for a collection with routes, the channels of its audience (`ChangeMapping+Routes.swift`).
/// A truncate goes to the collection's channel `<prefix>/<collection…>`.
public struct ChangeMapping: Sendable {
    public var prefix: String
    public var includeDocument: Bool
    /// Routes by collection (`public.notes`), each collection's in the order given; a collection without routes
    /// keeps the layout above.
    public private(set) var routes: [String: [Route]]
    /// Every route, in the order given.
    public private(set) var routeList: [Route]
    /// The most channels one route may give one change (an array field with `[]`); past it the route gives none
    /// for that change, counted and logged as `fan_out`.
    public var maxChannelsPerRoute: Int

    public init(
        prefix: String = "/changes", includeDocument: Bool = false, routes: [Route] = [],
        maxChannelsPerRoute: Int = 1000
    ) {
        var prefix = prefix
        while prefix.count > 1 && prefix.hasSuffix("/") { prefix.removeLast() }
        self.prefix = prefix
        self.includeDocument = includeDocument
        self.routes = Dictionary(grouping: routes, by: \.collection)
        self.routeList = routes
        self.maxChannelsPerRoute = maxChannelsPerRoute
    }

    /// Whether `prefix` gives valid, publishable channels (not `/meta`, no wildcard).
    public static func isValidPrefix(_ prefix: String) -> Bool {
        guard case .name? = Channel.kind(of: prefix) else { return false }
        return !Channel.isMeta(prefix) && !Channel.isService(prefix)
    }

    public func channel(for change: Change) -> String {
        var channel = prefix
        for segment in change.collection { channel += "/" + ChannelSegment.escape(segment) }
        if let id = change.id { channel += "/" + ChannelSegment.escape(id) }
        return channel
    }

    /// The collection's own channel, `<prefix>/<collection…>`: a truncate's, for operators.
    public func collectionChannel(for change: Change) -> String {
        var channel = prefix
        for segment in change.collection { channel += "/" + ChannelSegment.escape(segment) }
        return channel
    }

    public func message(for change: Change, sourceID: String) -> RelayMessage {
        let key = Self.key(sourceID: sourceID, change: change)
        return RelayMessage(
            channel: channel(for: change), data: .object(data(for: change, sourceID: sourceID, key: key)),
            key: key)
    }

    func data(for change: Change, sourceID: String, key: String) -> JSONObject {
        var data: JSONObject = [
            "id": change.id.map(JSONValue.string) ?? .null,
            "op": .string(change.operation.rawValue),
            "seq": .string(change.seq),
            "key": .string(key),
            "collection": .string(change.collection.joined(separator: ".")),
            "source": .string(sourceID),
        ]
        for (name, value) in change.extra.entries where data[name] == nil { data[name] = value }
        if includeDocument, let document = change.document { data["doc"] = .object(document) }
        return data
    }

    /// `sha256(source | collection | id | seq | op)`, the first 128 bits in hex: the same change always gets the
    /// same key, also when the source replays it after a crash. A routed change's message on each channel adds
    /// the channel (`| channel`), so that the messages of one change on several channels have keys of their own.
    public static func key(sourceID: String, change: Change, channel: String? = nil) -> String {
        var hasher = SHA256()
        var parts = [
            sourceID, change.collection.joined(separator: "."), change.id ?? "", change.seq,
            change.operation.rawValue,
        ]
        if let channel { parts.append(channel) }
        for part in parts {
            hasher.update(data: Array(part.utf8))
            hasher.update(data: [0])
        }
        let digest = hasher.finalize()
        return digest.prefix(16).map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }
}
