import Bayeux

/// The position of the last message seen on each subscription (a channel or pattern), as the broker's
/// `ext.position` gives it: what a client sends back as `ext.resume` to get what it missed (docs/PROTOCOL.md,
/// "Positions and resume after reconnect"). Positions are opaque strings, never compared.
public struct SubscriptionPositions: Sendable, Hashable {
    public private(set) var byChannel: [String: String]

    public init(_ byChannel: [String: String] = [:]) {
        self.byChannel = byChannel
    }

    public subscript(channel channel: String) -> String? {
        get { byChannel[channel] }
        set { byChannel[channel] = newValue }
    }

    /// Records a delivered message's position on every subscription held here that matches its channel;
    /// returns whether any did. A message without a position (a broker with history off) changes nothing.
    @discardableResult
    public mutating func record(_ message: Message) -> Bool {
        guard let name = message.channel, let position = message.ext?["position"]?.stringValue else { return false }
        var changed = false
        for channel in byChannel.keys where Channel.matches(pattern: channel, name: name) {
            byChannel[channel] = Self.advance(byChannel[channel], to: position)
            changed = true
        }
        return changed
    }

    /// The position after a message at `position`. A broker spread over shards (`--redis-shards`) gives at the
    /// handshake a position with one part per shard (`2.<epoch>.<p>~2.<epoch>.<p>…`), and each message the
    /// position of its shard, which that shard's epoch names: the part with the message's epoch is replaced, so a
    /// subscription over several shards (`/**`) keeps resuming exactly. Anything else is replaced whole.
    static func advance(_ stored: String?, to position: String) -> String {
        guard let stored, stored.contains("~"), !position.contains("~"), let shard = epoch(of: position[...]) else {
            return position
        }
        var parts = stored.split(separator: "~", omittingEmptySubsequences: false)
        guard let i = parts.firstIndex(where: { epoch(of: $0) == shard }) else { return position }
        parts[i] = position[...]
        return parts.joined(separator: "~")
    }

    private static func epoch(of token: Substring) -> Substring? {
        let fields = token.split(separator: ".", omittingEmptySubsequences: false)
        return fields.count == 3 ? fields[1] : nil
    }
}
