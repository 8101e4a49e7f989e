import NIOConcurrencyHelpers

/// What each feed of a relay file is doing, for `/readyz` of `pubsub serve --relay`: `FeedRunner` sets it, the
/// server reads it. A broker whose relay is behind still serves its clients, so the feeds' lines are said beside
/// the broker's readiness and never change it.
public final class RelayHealth: Sendable {
    public enum State: Sendable, Equatable, CustomStringConvertible {
        case starting
        case relaying
        /// Further behind its server than the source allows (`ChangeSource.isBehind`), with the lag when known.
        case behind(SourceLag?)
        /// Stopped on an error and started again after a pause.
        case restarting(String)
        /// Stopped for good: the database refuses the feed as configured.
        case stopped(String)

        public var description: String {
            switch self {
            case .starting: "starting"
            case .relaying: "relaying"
            case .behind(let lag): "behind" + (lag.map { " (\($0.amount) \($0.unit))" } ?? "")
            case .restarting(let error): "restarting after an error: " + Self.oneLine(error)
            case .stopped(let error): "stopped: " + Self.oneLine(error)
            }
        }

        /// An error's text on one line: `/readyz` says one line per feed.
        private static func oneLine(_ text: String) -> String {
            text.split(whereSeparator: \.isNewline).joined(separator: " ")
        }
    }

    private let states = NIOLockedValueBox<[(feed: String, state: State)]>([])

    public init() {}

    public func set(_ feed: String, _ state: State) {
        states.withLockedValue { states in
            if let index = states.firstIndex(where: { $0.feed == feed }) {
                states[index].state = state
            } else {
                states.append((feed, state))
            }
        }
    }

    public func state(of feed: String) -> State? {
        states.withLockedValue { states in states.first { $0.feed == feed }?.state }
    }

    /// One line per feed, in the order they first reported: `relay notes: relaying`.
    public var lines: [String] {
        states.withLockedValue { states in states.map { "relay \($0.feed): \($0.state)" } }
    }
}
