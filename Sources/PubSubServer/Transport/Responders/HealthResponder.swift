import NIOCore
import NIOHTTP1

/// `/healthz` on the broker's port: the process answers. (Readiness is `/readyz`, `MetricsResponder`.)
struct HealthResponder: HTTPResponder {
    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply {
        .now(.text(.ok, "ok\n"))
    }
}
