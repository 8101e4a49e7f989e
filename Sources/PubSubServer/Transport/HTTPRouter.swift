import NIOCore
import NIOHTTP1

/// Hands a routed request to its responder, on the broker's port and on the metrics port alike. On the broker's
/// port the Bayeux mount is served by the connection's `HTTPHandler`, which keeps the connection's delivery
/// state; the metrics port serves only the operational routes, the API and the dashboard.
struct HTTPRouter {
    let shared: ServerShared
    /// Routed on the metrics port (`--metrics-port`) rather than the broker's.
    var onMetricsPort = false

    /// The reply of the route's responder, or nil for the Bayeux mount on the broker's port.
    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply? {
        switch request.route {
        case .bayeux, .bayeuxWithSuffix, .staticFile, .notFound:
            if onMetricsPort { return .now(.text(.notFound, "Not found\n")) }
            switch request.route {
            case .bayeux, .bayeuxWithSuffix: return nil
            case .staticFile: return StaticFileResponder().reply(to: request, on: loop)
            default: return NotFoundResponder(mount: shared.mount).reply(to: request, on: loop)
            }
        case .health:
            return HealthResponder().reply(to: request, on: loop)
        case .ready, .metrics:
            return MetricsResponder(shared: shared, onMetricsPort: onMetricsPort).reply(to: request, on: loop)
        case .api:
            return APIResponder(api: shared.api, trustForwardedFor: shared.operations.configuration.trustForwardedFor)
                .reply(to: request, on: loop)
        case .admin:
            return AdminResponder(api: shared.api).reply(to: request, on: loop)
        }
    }
}
