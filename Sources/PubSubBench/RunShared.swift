import Atomics
import NIOConcurrencyHelpers
import NIOCore

/// What every client of one run shares: channel names, who listens where, and the two counters that keep the
/// as-fast-as-possible mode honest (deliveries expected versus deliveries received, over all loops).
final class RunShared: Sendable {
    let options: BenchOptions
    /// Channel names by index; the marker in each event carries the index.
    let channels: [String]
    let channelIndex: [String: Int]
    /// Channel indexes each subscriber slot joins.
    let memberships: [[Int]]
    let expected = ManagedAtomic<Int>(0)
    let delivered = ManagedAtomic<Int>(0)
    /// Waiting publishers are woken once no more than this many deliveries are outstanding (set before
    /// publishing starts; half the window).
    let wakeThreshold = ManagedAtomic<Int>(0)
    let gates: [PublisherGate]
    let supportedTypes: String

    init(options: BenchOptions, runId: String) {
        self.options = options
        let prefix = "/bench/\(runId)"
        var channels: [String] = []
        var memberships: [[Int]] = []
        switch options.scenario {
        case .fanout:
            channels = ["\(prefix)/fanout"]
            memberships = Array(repeating: [0], count: options.subscribers)
        case .idle:
            channels = ["\(prefix)/idle"]
            memberships = Array(repeating: [0], count: options.subscribers)
        case .publish:
            channels = ["\(prefix)/publish"]
            memberships = Array(repeating: [0], count: options.subscribers)
        case .rooms:
            channels = (0..<options.rooms).map { "\(prefix)/room/\($0)" }
            // Each client joins K distinct rooms drawn at random (seeded by its index, so runs repeat), as in
            // CometD's benchmark; rooms therefore differ a little in size, and the expected deliveries follow.
            memberships = (0..<options.subscribers).map { i in
                var random = SplitMix64(seed: UInt64(i))
                var rooms: [Int] = []
                while rooms.count < options.roomsPerClient {
                    let room = Int(random.next() % UInt64(options.rooms))
                    if !rooms.contains(room) { rooms.append(room) }
                }
                return rooms
            }
        }
        self.channels = channels
        var index: [String: Int] = [:]
        for (i, name) in channels.enumerated() { index[name] = i }
        self.channelIndex = index
        self.memberships = memberships
        self.gates = (0..<max(1, options.publishers)).map { _ in PublisherGate() }
        self.supportedTypes = options.transport == .websocket ? "\"websocket\",\"long-polling\"" : "\"long-polling\""
    }

    /// Deliveries expected but not yet received, over the whole run.
    var outstanding: Int { expected.load(ordering: .relaxed) - delivered.load(ordering: .relaxed) }

    /// Called by a subscriber after it counted `count` receipts: wakes publishers waiting for room.
    func received(_ count: Int) {
        let now = delivered.wrappingIncrementThenLoad(by: count, ordering: .relaxed)
        guard expected.load(ordering: .relaxed) - now <= wakeThreshold.load(ordering: .relaxed) else { return }
        for gate in gates where gate.blocked.load(ordering: .relaxed) {
            gate.wake()
        }
    }
}

/// A publisher blocked on the window; whoever makes room wakes it on its own loop.
final class PublisherGate: Sendable {
    let blocked = ManagedAtomic<Bool>(false)
    /// Set once, on the publisher's loop, before it starts publishing; read by whoever wakes it.
    private let waker = NIOLockedValueBox<(loop: any EventLoop, resume: @Sendable () -> Void)?>(nil)

    func install(loop: any EventLoop, resume: @escaping @Sendable () -> Void) {
        waker.withLockedValue { $0 = (loop, resume) }
    }

    func wake() {
        guard blocked.compareExchange(expected: true, desired: false, ordering: .acquiringAndReleasing).exchanged,
            let (loop, resume) = waker.withLockedValue({ $0 })
        else { return }
        loop.execute(resume)
    }
}

/// How one publisher publishes, fixed when the load starts.
struct PublishPlan: Sendable {
    /// Subscribers per channel index (counted from the subscriptions that succeeded).
    var fanout: [Int]
    var windowStart: UInt64
    /// When publishing stops (duration mode), or `.max`.
    var windowEnd: UInt64
    /// Publishes per second for this publisher; 0 for as fast as the window allows.
    var rate: Double
    /// Publishes this publisher makes inside the window (message-count mode), or nil.
    var budget: Int?
    /// Deliveries allowed outstanding over the run before publishers wait.
    var windowDeliveries: Int
    /// Publishes one publisher may have unacknowledged.
    var windowAcks: Int
}

/// A small seeded generator (SplitMix64), so that room choices are random but the same on every run.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed &+ 0x9E37_79B9_7F4A_7C15 }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
