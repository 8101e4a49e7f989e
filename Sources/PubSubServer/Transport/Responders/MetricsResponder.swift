import NIOCore
import NIOHTTP1

/// `/readyz` and `/metrics` on the broker's port, answered as on the metrics port
/// (`ServerShared.operationalResponse`); `/metrics` is not found here when a metrics port is configured.
struct MetricsResponder: HTTPResponder {
    let shared: ServerShared

    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply {
        guard let response = shared.operationalResponse(request.route, onMetricsPort: false, on: loop) else {
            return .now(.text(.notFound, "Not found\n"))
        }
        return .later(response.map { status, headers, body in HTTPResponse(status: status, headers: headers, body: body) })
    }
}
