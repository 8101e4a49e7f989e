import PubSubCore

/// Session events of the Redis engine, each reported once, by the node where it happened: a handshake,
/// subscribe, unsubscribe or `/meta/disconnect` by the node that handled the request; a kick by the node that
/// served the API call; an overflow by the node holding the session's queue (or whose connection dropped it); an
/// expiry by the node whose sweep expired it (the sweep runs on one node per period, for the whole cluster).
/// The local store's own events (sessions moving between nodes, a `D` notification evicting a session that
/// ended elsewhere) are not reported: the local `MemoryEngine` has no observer.
extension RedisEngine {
    func report(_ events: [SessionEvent]) {
        guard let observer = self.events, !events.isEmpty else { return }
        observer.sessionEvents(events)
    }

    /// The channels a subscribe added: a channel the session already had is not reported again.
    func reportSubscribed(_ clientId: String, added: [String], user: String?) {
        guard events != nil else { return }
        report(added.map { SessionEvent(kind: .subscribe, clientId: clientId, channel: $0, user: user) })
    }

    /// The channels an unsubscribe removed: only those the session had.
    func reportUnsubscribed(_ clientId: String, removed: [String], user: String?) {
        guard events != nil else { return }
        report(removed.map { SessionEvent(kind: .unsubscribe, clientId: clientId, channel: $0, user: user) })
    }

    /// The channels of a script's reply array (`added` or `removed`).
    static func channels(in reply: RESPValue?) -> [String] {
        (reply?.array ?? []).compactMap(\.string)
    }

    func reportEnded(_ ended: [(id: String, user: String?)], _ reason: DetachReason) {
        guard events != nil, let why = SessionEvent.EndReason(reason) else { return }
        report(ended.map { SessionEvent(kind: .disconnect, clientId: $0.id, user: $0.user, reason: why) })
    }

    /// A user as a script answers it: '' (or nothing) for none.
    static func user(in reply: RESPValue?) -> String? {
        guard let user = reply?.string, !user.isEmpty else { return nil }
        return user
    }

}
