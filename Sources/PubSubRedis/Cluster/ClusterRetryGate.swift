import NIOCore

/// Keeps the engine's scripts in the order they were asked for while Redis Cluster refuses them.
///
/// A script refused during a slot migration (`ASK`, `TRYAGAIN`, `MOVED`, `CLUSTERDOWN`: it did not run) is sent
/// again after a delay. Without a gate, a publish asked for during that delay would be sent at once and could
/// run before the refused one, and two refused scripts could come back in a different order. So once a script
/// is refused, the gate closes: the refused script and every script asked for after it wait in one queue, in
/// the order they were asked for (each has a ticket), and are sent one at a time, each after the one before has
/// run or failed; the gate opens again when the queue is empty. Scripts already on the wire when the gate
/// closed join the queue at their ticket's place should they be refused too.
///
/// The queue is bounded: past `capacity` a script is refused at once. When the head has used all its attempts
/// (the slot has been unavailable for about 3 s), everything queued fails with it, unsent, rather than wait its
/// own 3 s.
///
/// Events in (`admit`, `finished`, `drain`), actions out; the engine sends, schedules and fails.
struct ClusterRetryGate<Job> {
    struct Entry {
        var ticket: UInt64
        var job: Job
        /// How many times this script was refused.
        var attempt: Int
    }

    enum Admission: Equatable {
        /// The gate is open: send it now, with this ticket.
        case send(ticket: UInt64)
        /// Queued behind a refused script; the gate will ask for it to be sent.
        case held
        /// The queue is full.
        case refused
    }

    /// What became of a script that was sent.
    enum Outcome: Equatable {
        /// It ran (or failed for a reason the cluster did not cause): its caller has the result.
        case done
        /// Refused; to be sent again after this delay.
        case retry(after: TimeAmount)
        /// Refused, and out of attempts: the slot is unavailable.
        case gaveUp
    }

    enum Action {
        /// Send this queued script now.
        case send(Entry)
        /// Send this refused script again after the delay.
        case schedule(Entry, after: TimeAmount)
        /// These queued scripts fail, never sent.
        case fail([Job])
    }

    let capacity: Int
    /// The queue, by ticket. While it is not empty, its first entry is on the wire or scheduled (the head).
    private(set) var queue: [Entry] = []
    private var nextTicket: UInt64 = 0

    init(capacity: Int) {
        self.capacity = capacity
    }

    var isOpen: Bool { queue.isEmpty }

    mutating func admit(_ job: Job) -> Admission {
        let ticket = nextTicket
        nextTicket += 1
        if queue.isEmpty { return .send(ticket: ticket) }
        guard queue.count < capacity else { return .refused }
        queue.append(Entry(ticket: ticket, job: job, attempt: 0))
        return .held
    }

    /// A script sent with `ticket` (by `admit`, or by an action of the gate) after `attempt` refusals came back.
    mutating func finished(ticket: UInt64, job: Job, attempt: Int, outcome: Outcome) -> [Action] {
        let isHead = queue.first?.ticket == ticket
        switch (outcome, isHead) {
        case (.done, true):
            queue.removeFirst()
            return queue.first.map { [.send($0)] } ?? []
        case (.gaveUp, true):
            let rest = queue.dropFirst().map(\.job)
            queue.removeAll()
            return rest.isEmpty ? [] : [.fail(rest)]
        case (.retry(let delay), true):
            queue[0].attempt = attempt + 1
            return [.schedule(queue[0], after: delay)]
        case (.retry(let delay), false):
            // Sent while the gate was open: it joins the queue at its ticket's place (never before the head,
            // which is already on its way).
            let entry = Entry(ticket: ticket, job: job, attempt: attempt + 1)
            if queue.isEmpty {
                queue.append(entry)
                return [.schedule(entry, after: delay)]
            }
            let index = queue.dropFirst().firstIndex { $0.ticket > ticket } ?? queue.endIndex
            queue.insert(entry, at: index)
            return []
        case (.done, false), (.gaveUp, false):
            return []
        }
    }

    /// Everything queued behind the head, for the engine to fail when it closes (the head is on the wire or
    /// scheduled, and finishes by itself).
    mutating func drain() -> [Job] {
        let rest = queue.dropFirst().map(\.job)
        queue.removeSubrange(queue.indices.dropFirst())
        return rest
    }
}

extension ClusterRetryGate.Entry: Sendable where Job: Sendable {}

extension ClusterRetryGate: Sendable where Job: Sendable {}
