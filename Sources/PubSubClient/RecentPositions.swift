import Bayeux

/// The positions of the last messages delivered, to drop one the broker sends again: after a WebSocket dies while
/// its session lives, the broker re-sends on the next connection what it wrote but the client had not confirmed, and
/// a resume (`ext.resume`) may cover events that arrived already. A message carries the same `ext.position` on every
/// delivery (docs/PROTOCOL.md), so a position seen before means the same message. Bounded: the oldest position is
/// forgotten first, once `capacity` are held.
public struct RecentPositions: Sendable, Hashable {
    public static let defaultCapacity = 1000

    public let capacity: Int
    private var held: Set<String> = []
    private var order: [String] = []
    /// Where the next position goes in `order` once it is full (the oldest one's slot).
    private var next = 0

    public init(capacity: Int = Self.defaultCapacity) {
        precondition(capacity > 0, "RecentPositions needs room for at least one position")
        self.capacity = capacity
    }

    public var count: Int { held.count }

    public func contains(_ position: String) -> Bool { held.contains(position) }

    /// Adds `position`; false when it was held already (a repeat of a message delivered before).
    public mutating func insert(_ position: String) -> Bool {
        guard held.insert(position).inserted else { return false }
        if order.count < capacity {
            order.append(position)
        } else {
            held.remove(order[next])
            order[next] = position
            next = (next + 1) % capacity
        }
        return true
    }
}
