import NIOCore
import Testing

@testable import PubSubRedis

/// The order of scripts while Redis Cluster refuses them, without sockets: jobs are names, the test plays the
/// server, and what the gate sends is recorded in order.
@Suite struct ClusterRetryGateTests {
    typealias Gate = ClusterRetryGate<String>

    /// Plays the engine: sends what the gate admits or asks for, and records the order of sends.
    struct Driver {
        var gate = Gate(capacity: 4)
        var tickets: [String: UInt64] = [:]
        var attempts: [String: Int] = [:]
        var sent: [String] = []
        var scheduled: [String: TimeAmount] = [:]
        var failed: [String] = []

        mutating func ask(_ job: String) -> Gate.Admission {
            let admission = gate.admit(job)
            if case .send(let ticket) = admission {
                tickets[job] = ticket
                attempts[job] = 0
                sent.append(job)
            }
            return admission
        }

        mutating func answer(_ job: String, _ outcome: Gate.Outcome) {
            let actions = gate.finished(ticket: tickets[job]!, job: job, attempt: attempts[job]!, outcome: outcome)
            for action in actions {
                switch action {
                case .send(let entry):
                    tickets[entry.job] = entry.ticket
                    attempts[entry.job] = entry.attempt
                    sent.append(entry.job)
                case .schedule(let entry, let delay):
                    tickets[entry.job] = entry.ticket
                    attempts[entry.job] = entry.attempt
                    scheduled[entry.job] = delay
                case .fail(let jobs):
                    failed += jobs
                }
            }
        }

        /// The scheduled retry of `job` fires.
        mutating func fire(_ job: String) {
            #expect(scheduled.removeValue(forKey: job) != nil, "\(job) was not scheduled")
            sent.append(job)
        }
    }

    @Test func anOpenGateSendsAtOnce() {
        var d = Driver()
        #expect(d.ask("a") == .send(ticket: 0))
        #expect(d.ask("b") == .send(ticket: 1))
        d.answer("a", .done)
        d.answer("b", .done)
        #expect(d.sent == ["a", "b"])
        #expect(d.gate.isOpen)
    }

    /// A publish asked for while a refused one waits its delay is sent after it, not before.
    @Test func scriptsAskedForDuringARetryWaitBehindIt() {
        var d = Driver()
        _ = d.ask("a")
        d.answer("a", .retry(after: .milliseconds(10)))
        #expect(d.scheduled["a"] == .milliseconds(10))
        #expect(!d.gate.isOpen)
        #expect(d.ask("b") == .held)
        #expect(d.ask("c") == .held)
        #expect(d.sent == ["a"])
        d.fire("a")
        d.answer("a", .retry(after: .milliseconds(20)))
        #expect(d.attempts["a"] == 2)
        d.fire("a")
        d.answer("a", .done)
        // One at a time: c waits for b.
        #expect(d.sent == ["a", "a", "a", "b"])
        d.answer("b", .done)
        #expect(d.sent.last == "c")
        d.answer("c", .done)
        #expect(d.gate.isOpen)
        #expect(d.ask("d") == .send(ticket: 3))
    }

    /// Scripts already on the wire when the gate closed, refused too, retry in the order they were asked for,
    /// even when a later one's refusal comes back first.
    @Test func refusedScriptsRetryInTheOrderAskedFor() {
        var d = Driver()
        _ = d.ask("a")
        _ = d.ask("b")
        _ = d.ask("c")
        d.answer("a", .retry(after: .milliseconds(10)))
        #expect(d.ask("d") == .held)
        d.answer("c", .retry(after: .milliseconds(10)))
        d.answer("b", .retry(after: .milliseconds(10)))
        #expect(Array(d.scheduled.keys) == ["a"])
        #expect(d.gate.queue.map(\.job) == ["a", "b", "c", "d"])
        d.fire("a")
        d.answer("a", .done)
        d.answer("b", .retry(after: .milliseconds(10)))  // refused again: it stays first
        d.fire("b")
        d.answer("b", .done)
        d.answer("c", .done)
        d.answer("d", .done)
        #expect(d.sent == ["a", "b", "c", "a", "b", "b", "c", "d"])
        #expect(d.attempts["c"] == 1)
        #expect(d.gate.isOpen)
    }

    /// A script on the wire that ran while another was refused is not held back; its result stands.
    @Test func aScriptThatRanIsLeftAlone() {
        var d = Driver()
        _ = d.ask("a")
        _ = d.ask("b")
        d.answer("a", .retry(after: .milliseconds(10)))
        d.answer("b", .done)
        #expect(d.gate.queue.map(\.job) == ["a"])
        d.fire("a")
        d.answer("a", .done)
        #expect(d.gate.isOpen)
    }

    /// Out of attempts: the slot is unavailable, so what waits fails with the head rather than wait its turn.
    @Test func givingUpFailsEverythingQueued() {
        var d = Driver()
        _ = d.ask("a")
        d.answer("a", .retry(after: .milliseconds(10)))
        _ = d.ask("b")
        _ = d.ask("c")
        d.fire("a")
        d.answer("a", .gaveUp)
        #expect(d.failed == ["b", "c"])
        #expect(d.gate.isOpen)
        #expect(d.ask("e") == .send(ticket: 3))
    }

    /// A script that gave up while the gate was open (not the head) changes nothing for the others.
    @Test func aDirectSendGivingUpIsItsCallersAlone() {
        var d = Driver()
        _ = d.ask("a")
        _ = d.ask("b")
        d.answer("a", .retry(after: .milliseconds(10)))
        d.answer("b", .gaveUp)
        #expect(d.failed.isEmpty)
        #expect(d.gate.queue.map(\.job) == ["a"])
    }

    @Test func theQueueIsBounded() {
        var d = Driver()
        _ = d.ask("a")
        d.answer("a", .retry(after: .milliseconds(10)))
        for job in ["b", "c", "d"] { #expect(d.ask(job) == .held) }
        #expect(d.ask("e") == .refused)
        #expect(d.gate.queue.count == 4)
    }

    /// Closing fails what waits behind the head; the head finishes by itself.
    @Test func drainLeavesTheHead() {
        var d = Driver()
        _ = d.ask("a")
        d.answer("a", .retry(after: .milliseconds(10)))
        _ = d.ask("b")
        #expect(d.gate.drain() == ["b"])
        d.fire("a")
        d.answer("a", .done)
        #expect(d.gate.isOpen)
        #expect(d.sent == ["a", "a"])
    }
}
