import NIOCore

/// The last `limit` ids inserted, for membership tests: the memory engine's clients dropped for overflow and
/// kicked by the server API, remembered so their next request is told why. Bounded: the oldest are forgotten.
struct RecentIDs {
    let limit: Int
    private var members: Set<String> = []
    private var order = CircularBuffer<String>()

    init(limit: Int) { self.limit = limit }

    mutating func insert(_ id: String) {
        guard members.insert(id).inserted else { return }
        order.append(id)
        if order.count > limit { members.remove(order.removeFirst()) }
    }

    func contains(_ id: String) -> Bool { members.contains(id) }
}
