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

/// Turns a change into the channel and `data` subscribers see:
/// `<prefix>/<collection…>/<escaped id>` with `{"id", "op", "seq", "key", "collection", "source", …, "doc"?}`.
/// A truncate goes to the collection's channel `<prefix>/<collection…>`.
public struct ChangeMapping: Sendable {
    public var prefix: String
    public var includeDocument: Bool

    public init(prefix: String = "/changes", includeDocument: Bool = false) {
        var prefix = prefix
        while prefix.count > 1 && prefix.hasSuffix("/") { prefix.removeLast() }
        self.prefix = prefix
        self.includeDocument = includeDocument
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

    public func message(for change: Change, sourceID: String) -> RelayMessage {
        let key = Self.key(sourceID: sourceID, change: change)
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
        return RelayMessage(channel: channel(for: change), data: .object(data), key: key)
    }

    /// `sha256(source | collection | id | seq | op)`, the first 128 bits in hex: the same change always gets the
    /// same key, also when the source replays it after a crash.
    public static func key(sourceID: String, change: Change) -> String {
        var hasher = SHA256()
        for part in [sourceID, change.collection.joined(separator: "."), change.id ?? "", change.seq,
                     change.operation.rawValue] {
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
