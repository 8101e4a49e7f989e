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
            byChannel[channel] = position
            changed = true
        }
        return changed
    }
}
