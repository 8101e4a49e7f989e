import NIOCore

/// Something that keeps one deadline in a `TimerQueue`: the queue records where its entry sits, so that moving
/// or cancelling it costs a sift, not a search.
protocol TimerQueueOwner: AnyObject {
    /// The index of the owner's entry in its queue, `-1` when it has none. Written by the queue only.
    var timerQueueIndex: Int { get set }
    /// The deadline has come (its entry is gone already): called by `LoopTimers` on the loop.
    func timerQueueDeadlineReached()
}

/// The deadlines of every connection of one event loop, as a pure binary min-heap: one entry per owner, no
/// closure, promise or task of its own (24 bytes in one shared array, where a scheduled task per connection
/// costs a task object, its closure context and a slot of the loop's own heap). The loop's `LoopTimers` arms a
/// single NIO timer for `earliest` and pops what is due. Nothing here touches a channel or a clock: tests
/// drive it with plain deadlines.
struct TimerQueue {
    private struct Entry {
        var deadline: NIODeadline
        var owner: any TimerQueueOwner
    }

    private var heap: [Entry] = []

    var count: Int { heap.count }
    var isEmpty: Bool { heap.isEmpty }

    /// The earliest deadline, when any owner has one.
    var earliest: NIODeadline? { heap.first?.deadline }

    /// The deadline `owner` has here, if any.
    func deadline(of owner: any TimerQueueOwner) -> NIODeadline? {
        let index = owner.timerQueueIndex
        guard index >= 0, index < heap.count, heap[index].owner === owner else { return nil }
        return heap[index].deadline
    }

    /// Sets `owner`'s deadline, replacing the one it had.
    mutating func schedule(_ owner: any TimerQueueOwner, at deadline: NIODeadline) {
        let index = owner.timerQueueIndex
        if index >= 0, index < heap.count, heap[index].owner === owner {
            let earlier = deadline < heap[index].deadline
            heap[index].deadline = deadline
            if earlier { siftUp(index) } else { siftDown(index) }
            return
        }
        heap.append(Entry(deadline: deadline, owner: owner))
        owner.timerQueueIndex = heap.count - 1
        siftUp(heap.count - 1)
    }

    /// Removes `owner`'s deadline; nothing happens when it has none.
    mutating func cancel(_ owner: any TimerQueueOwner) {
        let index = owner.timerQueueIndex
        guard index >= 0, index < heap.count, heap[index].owner === owner else { return }
        owner.timerQueueIndex = -1
        let last = heap.count - 1
        if index == last {
            heap.removeLast()
        } else {
            heap.swapAt(index, last)
            heap.removeLast()
            heap[index].owner.timerQueueIndex = index
            if index > 0, heap[index].deadline < heap[(index - 1) / 2].deadline {
                siftUp(index)
            } else {
                siftDown(index)
            }
        }
        // An emptied queue gives its array back (a burst of connections should not stay reserved).
        if heap.isEmpty { heap = [] }
    }

    /// Takes the owner of the earliest deadline if it is due at `now` (its entry is removed).
    mutating func popDue(now: NIODeadline) -> (any TimerQueueOwner)? {
        guard let first = heap.first, first.deadline <= now else { return nil }
        cancel(first.owner)
        return first.owner
    }

    private mutating func siftUp(_ start: Int) {
        var child = start
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].deadline < heap[parent].deadline else { break }
            swapEntries(child, parent)
            child = parent
        }
    }

    private mutating func siftDown(_ start: Int) {
        var parent = start
        let count = heap.count
        while true {
            let left = 2 * parent + 1
            guard left < count else { return }
            var smallest = left
            let right = left + 1
            if right < count, heap[right].deadline < heap[left].deadline { smallest = right }
            guard heap[smallest].deadline < heap[parent].deadline else { return }
            swapEntries(parent, smallest)
            parent = smallest
        }
    }

    private mutating func swapEntries(_ a: Int, _ b: Int) {
        heap.swapAt(a, b)
        heap[a].owner.timerQueueIndex = a
        heap[b].owner.timerQueueIndex = b
    }
}
