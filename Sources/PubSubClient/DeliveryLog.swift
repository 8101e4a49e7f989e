import Bayeux

/// What a client has delivered: the position of the last message of each subscription (with resume on) and the
/// positions of the last messages, to deliver each message once.
struct DeliveryLog: Sendable {
    var positions = SubscriptionPositions()
    var recent = RecentPositions()
    /// Whether `positions` is kept (the client resumes); duplicates are dropped either way.
    var tracksPositions: Bool

    /// Whether `message` is to be delivered: not when its position was delivered before. Records its position on
    /// the subscriptions it matches.
    mutating func accept(_ message: Message) -> Bool {
        if let position = message.ext?["position"]?.stringValue, !recent.insert(position) { return false }
        if tracksPositions { positions.record(message) }
        return true
    }
}
