import ServiceLifecycle

/// The server as a swift-service-lifecycle `Service`: it serves until the group shuts down gracefully (SIGTERM),
/// then drains within the configured drain timeout.
extension PubSubServer: Service {
    public func run() async throws {
        if shared.operations.phase == .starting { try await start() }
        try? await gracefulShutdown()
        await drain()
    }
}
