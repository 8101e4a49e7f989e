import Bayeux

/// Public channels: subscriptions that need no signature.
///
/// A subscription is public when every channel it can ever receive is matched by one of the public patterns:
/// `/news/**` makes `/news/today`, `/news/*` and `/news/sport/**` public; `/news/*` makes `/news/today` and
/// `/news/*` public but not `/news/**` (which also receives `/news/sport/results`).
extension PrivatePubAuth {
    func isPublicSubscription(_ message: Message) -> Bool {
        guard !publicChannels.isEmpty else { return false }
        let requested: [JSONValue]
        switch message["subscription"] {
        case .string?: requested = [message["subscription"]!]
        case .array(let a)? where !a.isEmpty: requested = a
        default: return false
        }
        return requested.allSatisfy { value in
            guard let channel = value.stringValue else { return false }
            return publicChannels.contains { Self.pattern($0, covers: channel) }
        }
    }

    /// Whether everything `subscription` (a name or a wildcard pattern) receives is matched by `pattern`.
    public static func pattern(_ pattern: String, covers subscription: String) -> Bool {
        guard Channel.isValidNameOrPattern(subscription) else { return false }
        if pattern == subscription || pattern == "/**" { return true }
        if pattern.hasSuffix("/**") {
            let prefix = pattern.dropLast(2)
            return subscription.count > prefix.count && subscription.hasPrefix(prefix)
        }
        if pattern.hasSuffix("/*") {
            let prefix = pattern.dropLast(1)
            guard Channel.kind(of: subscription) == .name, subscription.hasPrefix(prefix) else { return false }
            let rest = subscription.dropFirst(prefix.count)
            return !rest.isEmpty && !rest.contains("/")
        }
        return false
    }
}
