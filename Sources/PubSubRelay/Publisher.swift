/// Where the relay publishes: the standalone relay uses a Bayeux client, `pubsub serve` could publish in-process.
public protocol Publisher: Sendable {
    /// Publishes the messages in order (messages of one document keep their order) and returns only once the
    /// broker acknowledged every one of them; throws otherwise (some may then have been delivered).
    func publish(_ messages: [RelayMessage]) async throws
}
