import Logging
import NIOHTTP1

extension HTTPHandler {
    /// Why a browser request to the mount path is refused (403), or nil: an `Origin` outside `--allowed-origins`
    /// (a preflight included, so it gets no `Access-Control-Allow-*`), or JSON-P when callback-polling is off.
    func browserAccessRefusal(_ head: HTTPRequestHead) -> String? {
        let configuration = shared.configuration
        if !configuration.origins.allows(head.headers) {
            shared.logger.debug(
                "origin refused", metadata: ["pubsub.origin": "\(head.headers.first(name: "origin") ?? "")"])
            return "Origin not allowed\n"
        }
        // Callback-polling is a GET carrying its messages in `message=` (EventSource and WebSocket carry none).
        if !configuration.callbackPolling, head.method == .GET, head.uri.contains("message=") {
            return "Callback-polling (JSON-P) is disabled\n"
        }
        return nil
    }
}
