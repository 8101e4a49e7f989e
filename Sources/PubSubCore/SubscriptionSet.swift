/// The channels one session is subscribed to. Most clients subscribe to one channel: that one is kept inline,
/// with no storage of its own (a `Set` of one allocates a hash table per session); two or more go in a `Set`.
struct SubscriptionSet: Sequence, ExpressibleByArrayLiteral {
    private enum Storage {
        case empty
        case one(String)
        case many(Set<String>)
    }

    private var storage = Storage.empty

    init() {}

    init(arrayLiteral channels: String...) {
        for channel in channels { insert(channel) }
    }

    var count: Int {
        switch storage {
        case .empty: 0
        case .one: 1
        case .many(let set): set.count
        }
    }

    var isEmpty: Bool { count == 0 }

    func contains(_ channel: String) -> Bool {
        switch storage {
        case .empty: false
        case .one(let only): only == channel
        case .many(let set): set.contains(channel)
        }
    }

    /// Adds `channel`; false when it was there already.
    @discardableResult
    mutating func insert(_ channel: String) -> Bool {
        switch storage {
        case .empty:
            storage = .one(channel)
            return true
        case .one(let only):
            if only == channel { return false }
            storage = .many([only, channel])
            return true
        case .many(var set):
            storage = .empty  // lets `set` be mutated in place
            let inserted = set.insert(channel).inserted
            storage = .many(set)
            return inserted
        }
    }

    /// Removes `channel`; returns it when it was there.
    @discardableResult
    mutating func remove(_ channel: String) -> String? {
        switch storage {
        case .empty:
            return nil
        case .one(let only):
            guard only == channel else { return nil }
            storage = .empty
            return only
        case .many(var set):
            storage = .empty
            let removed = set.remove(channel)
            storage = set.count == 1 ? .one(set.first!) : .many(set)
            return removed
        }
    }

    func makeIterator() -> IndexingIterator<[String]> {
        switch storage {
        case .empty: [String]().makeIterator()
        case .one(let only): [only].makeIterator()
        case .many(let set): Array(set).makeIterator()
        }
    }
}
