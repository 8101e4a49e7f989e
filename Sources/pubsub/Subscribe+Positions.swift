import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import PubSubClient

extension Subscribe {
    /// Subscribes to every channel, each from its position in the position file when it has one, and says on
    /// stderr how that went; returns the channels whose events since then cannot all be delivered.
    func subscribeAll(_ bayeux: BayeuxClient, from stored: SubscriptionPositions?, in file: PositionFile?)
        async throws -> [String]
    {
        var unrecovered: [String] = []
        for channel in channels {
            let from = stored?[channel: channel]
            let outcome = try await bayeux.subscribe(channel, resumeFrom: from)
            guard let from, let file else { continue }
            if let outcome, outcome.recovered {
                if !quiet {
                    printError("pubsub: resumed \(channel) from \(file.path): recovered \(outcome.missed) events")
                }
                continue
            }
            unrecovered.append(channel)
            let why =
                outcome == nil
                ? "the broker does not resume (its history is off, or it is not pubsub)"
                : "the broker no longer holds its position (recovered: false)"
            printError(
                "pubsub: cannot recover the events of \(channel) since \(from) in \(file.path): \(why)"
                    + (acceptGaps ? "; going on from here" : "; refetch, then run again"))
        }
        return unrecovered
    }

    /// What the position file starts with: where each subscription resumed from, or, where that failed or the
    /// file had none, the broker's position at the subscribe. Nil when the broker gives no positions.
    static func startPositions(
        _ channels: [String], stored: SubscriptionPositions?, unrecovered: [String], now: SubscriptionPositions
    ) -> SubscriptionPositions? {
        var start = SubscriptionPositions()
        for channel in channels {
            let kept = unrecovered.contains(channel) ? nil : stored?[channel: channel]
            guard let position = kept ?? now[channel: channel] else { return nil }
            start[channel: channel] = position
        }
        return start
    }
}

/// Keeps `subscribe --position-file` up to date: the position of the last event printed on each subscription.
///
/// Each event's line is written to standard output first, then its position to the file (replaced whole:
/// written to a temporary file and renamed over it). Every replacement but one per `durableEvery` skips fsync;
/// `flush()` (called every `durableEvery` and at exit) makes the latest one durable. So:
/// - after `kill -9` the file holds the position of the last line printed, or of the one before it when the kill
///   came between the line and the rename: at most that one line is printed again by the next run;
/// - after a power cut, the events printed in the last `durableEvery` are printed again by the next run.
/// Every event at least once, in order; a repeated line carries the same `ext.position` (`--full`).
final class PositionRecorder: Sendable {
    static let durableEvery: TimeAmount = .milliseconds(200)

    private struct State {
        var positions: SubscriptionPositions
        var durable: SubscriptionPositions?
        var lastDurable: NIODeadline
    }

    let file: PositionFile
    private let state: NIOLockedValueBox<State>

    init(file: PositionFile, positions: SubscriptionPositions) {
        self.file = file
        self.state = NIOLockedValueBox(State(positions: positions, durable: nil, lastDurable: .distantPast))
    }

    var positions: SubscriptionPositions { state.withLockedValue { $0.positions } }

    /// Records a printed event's position on the subscriptions it matches and replaces the file.
    func record(_ message: Message) throws {
        try state.withLockedValue { state in
            guard state.positions.record(message) else { return }
            try write(&state, durable: NIODeadline.now() - state.lastDurable >= Self.durableEvery)
        }
    }

    /// Sets where a subscription continues from (after `recovered: false`: the broker's current position).
    func set(_ channel: String, _ position: String?) {
        state.withLockedValue { $0.positions[channel: channel] = position }
    }

    /// Makes the file durable with the latest positions, unless it already is.
    func flush() throws {
        try state.withLockedValue { state in
            guard state.durable != state.positions else { return }
            try write(&state, durable: true)
        }
    }

    private func write(_ state: inout State, durable: Bool) throws {
        try file.write(state.positions, durable: durable)
        if durable {
            state.durable = state.positions
            state.lastDurable = .now()
        }
    }
}
