import NIOCore

/// Hands a routed request to its responder; the Bayeux mount is served by the connection's `HTTPHandler`,
/// which keeps the connection's delivery state.
struct HTTPRouter {
    let shared: ServerShared

    /// The reply of the route's responder, or nil for the Bayeux mount.
    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply? {
        switch request.route {
        case .bayeux, .bayeuxWithSuffix:
            return nil
        case .health:
            return HealthResponder().reply(to: request, on: loop)
        case .ready, .metrics:
            return MetricsResponder(shared: shared).reply(to: request, on: loop)
        case .api:
            return APIResponder(api: shared.api, trustForwardedFor: shared.operations.configuration.trustForwardedFor)
                .reply(to: request, on: loop)
        case .admin:
            return AdminResponder(api: shared.api).reply(to: request, on: loop)
        case .staticFile:
            return StaticFileResponder().reply(to: request, on: loop)
        case .notFound:
            return NotFoundResponder(mount: shared.mount).reply(to: request, on: loop)
        }
    }
}
