import NIOCore
import NIOHTTP1
import PubSubCore

/// `/readyz`, and `/metrics`: on the metrics port, or on the broker's port when there is no metrics port (else
/// it is not found there).
struct MetricsResponder: HTTPResponder {
    let shared: ServerShared
    let onMetricsPort: Bool

    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply {
        let operations = shared.operations
        switch request.route {
        case .ready:
            let ready = operations.isReady(engine: shared.broker.engine)
            let text: String
            switch operations.phase {
            case .serving:
                let note = (shared.broker.engine as? any EngineObservability)?.readinessNote.map { ": " + $0 } ?? ""
                text = ready ? "ready\n" : "engine not ready\(note)\n"
            case .starting: text = "starting\n"
            case .draining, .stopped: text = "draining\n"
            }
            return .now(Self.noStore(.text(ready ? .ok : .serviceUnavailable, text + operations.readinessNoteText)))
        case .metrics where onMetricsPort || !operations.hasMetricsListener:
            return .later(
                operations.renderMetrics(engine: shared.broker.engine, on: loop).map { body in
                    var response = Self.noStore(HTTPResponse(status: .ok, headers: [:], body: body))
                    response.headers.add(name: "Content-Type", value: "text/plain; version=0.0.4; charset=utf-8")
                    return response
                })
        default:
            return .now(.text(.notFound, "Not found\n"))
        }
    }

    /// Probes and scrapes are never cached.
    static func noStore(_ response: HTTPResponse) -> HTTPResponse {
        var response = response
        response.headers.add(name: "Cache-Control", value: "no-store")
        return response
    }
}
