import Bayeux

extension ChangeMapping {
    /// A route that gave no channel for a change, and why: counted in `pubsub_relay_unrouted_total` and logged
    /// once per collection, route and reason.
    public struct Unrouted: Sendable, Hashable {
        public var route: Route
        public var reason: Route.Unroutable
    }

    /// What one change becomes: its messages, and the routes that gave it no channel.
    public struct Mapped: Sendable {
        public var messages: [RelayMessage]
        public var unrouted: [Unrouted]
    }

    /// What `data.audience` says on a routed update that moved a row between audiences.
    public enum Audience: String, Sendable {
        /// The row is no longer this channel's: drop it (`doc` is left out, so the old audience never reads the
        /// new values).
        case left
        /// The row is this channel's from now on: the client did not have it before (or may not have had it: the
        /// old values are unknown).
        case joined
    }

    /// The messages of one change. Without routes for its collection: the one message of `message(for:)`.
    /// With routes:
    /// - insert: the channels of the new row; delete: of the old row (`previous`, else the deleted document);
    /// - update: the channels of the new row, and of the old one that the new one no longer has with
    ///   `audience: "left"` (sent first), and those the old one did not have with `audience: "joined"` (all of
    ///   them when the old values are unknown);
    /// - truncate: the collection's channel `<prefix>/<collection…>`, which only operators should read.
    /// A channel that several routes give gets one message.
    public func messages(for change: Change, sourceID: String) -> Mapped {
        let collection = change.collection.joined(separator: ".")
        guard let routes = routes[collection], !routes.isEmpty else {
            return Mapped(messages: [message(for: change, sourceID: sourceID)], unrouted: [])
        }
        if change.operation == .truncate {
            return Mapped(
                messages: [routed(change, to: collectionChannel(for: change), sourceID: sourceID)], unrouted: [])
        }
        var unrouted: [Unrouted] = []
        var new = OrderedChannels()
        var old = OrderedChannels()
        let newRow = change.operation == .delete ? nil : (change.document ?? [:])
        for route in routes {
            if let newRow {
                switch route.channels(for: newRow, variables: change.variables, maxChannels: maxChannelsPerRoute) {
                case .channels(let channels): new.append(channels)
                case .unroutable(let reason): unrouted.append(Unrouted(route: route, reason: reason))
                }
            }
            guard change.operation != .insert else { continue }
            // The old row: what the source gave, else (a delete) the deleted document itself. A field it does not
            // hold at all (a PostgreSQL identity without the column, a tombstone, nothing remembered) is unknown,
            // not NULL: the old audience cannot be told, and that is counted.
            // A route of source variables only (Simperium's `{user}`) needs no old row at all.
            let variablesOnly = route.fields.allSatisfy { field in
                !field.documentOnly && field.path.count == 1 && change.variables[field.path[0]] != nil
            }
            guard
                let oldRow = change.previous ?? (change.operation == .delete ? change.document : nil)
                    ?? (variablesOnly ? [:] : nil),
                route.fields.allSatisfy({ field in
                    oldRow.contains(field.path[0])
                        || (!field.documentOnly && field.path.count == 1 && change.variables[field.path[0]] != nil)
                })
            else {
                unrouted.append(Unrouted(route: route, reason: .noPrevious))
                continue
            }
            switch route.channels(for: oldRow, variables: change.variables, maxChannels: maxChannelsPerRoute) {
            case .channels(let channels):
                old.append(channels)
            case .unroutable(let reason):
                // An update's old row that had no audience on this route is no loss; anything else is counted.
                if change.operation == .delete || (reason != .null && reason != .empty) {
                    unrouted.append(Unrouted(route: route, reason: reason))
                }
            }
        }
        var messages: [RelayMessage] = []
        switch change.operation {
        case .insert:
            for channel in new.list { messages.append(routed(change, to: channel, sourceID: sourceID)) }
        case .delete:
            for channel in old.list { messages.append(routed(change, to: channel, sourceID: sourceID)) }
        case .update:
            let knowsOld = !unrouted.contains { $0.reason == .noPrevious }
            for channel in old.list where !new.contains(channel) {
                messages.append(routed(change, to: channel, sourceID: sourceID, audience: .left))
            }
            for channel in new.list {
                // Old values unknown: the client may not have the row, so it is told to add it.
                let audience: Audience? = !knowsOld || !old.contains(channel) ? .joined : nil
                messages.append(routed(change, to: channel, sourceID: sourceID, audience: audience))
            }
        case .truncate:
            break
        }
        return Mapped(messages: messages, unrouted: unrouted)
    }

    private func routed(_ change: Change, to channel: String, sourceID: String, audience: Audience? = nil)
        -> RelayMessage
    {
        let key = Self.key(sourceID: sourceID, change: change, channel: channel)
        var data = data(for: change, sourceID: sourceID, key: key)
        if let audience {
            data["audience"] = .string(audience.rawValue)
            if audience == .left { data["doc"] = nil }
        }
        return RelayMessage(channel: channel, data: .object(data), key: key)
    }
}

/// Channels in first-seen order, each once.
private struct OrderedChannels {
    private(set) var list: [String] = []
    private var seen = Set<String>()

    mutating func append(_ channels: [String]) {
        for channel in channels where seen.insert(channel).inserted { list.append(channel) }
    }

    func contains(_ channel: String) -> Bool { seen.contains(channel) }
}
