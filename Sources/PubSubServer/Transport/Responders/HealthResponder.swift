import NIOCore
import NIOHTTP1

/// `/healthz`: the process answers. (Readiness is `/readyz`, `MetricsResponder`.)
struct HealthResponder: HTTPResponder {
    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply {
        .now(MetricsResponder.noStore(.text(.ok, "ok\n")))
    }
}
