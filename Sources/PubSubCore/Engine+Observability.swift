/// What an engine tells operations about itself beyond `Engine.statistics`: whether it can serve now
/// (`/readyz`, `pubsub_ready`) and what it counts of its own (a clustered engine's outages and losses), read at
/// each scrape of `/metrics`. An engine without it is ready whenever the server is and adds no metrics.
public protocol EngineObservability: Sendable {
    /// Whether the engine can serve requests now (a clustered engine: connected to its store).
    var isReady: Bool { get }
    /// What this engine counts beyond `Engine.statistics`, read at each scrape of `/metrics`.
    var extraMetrics: [EngineMetric] { get }
    /// Why the engine is not ready, in a few words for `/readyz`; nil when it is, or when it cannot say.
    var readinessNote: String? { get }
}

extension EngineObservability {
    public var readinessNote: String? { nil }
}

/// One value an engine reports on `/metrics`: a counter (a running total, only ever growing) or a gauge.
public struct EngineMetric: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        case counter
        case gauge
    }

    /// The Prometheus name (`pubsub_redis_outages_total`).
    public var name: String
    public var help: String
    public var kind: Kind
    public var value: UInt64

    public init(name: String, help: String, kind: Kind, value: UInt64) {
        self.name = name
        self.help = help
        self.kind = kind
        self.value = value
    }
}
