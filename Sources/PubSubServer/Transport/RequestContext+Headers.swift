import NIOHTTP1
import PubSubCore

extension RequestContext {
    /// The headers authorizers may see (`RequestContext.forwardedHeaders`), from a request or WebSocket upgrade.
    static func authorizationHeaders(_ headers: HTTPHeaders) -> [String: String] {
        var picked: [String: String] = [:]
        for name in forwardedHeaders {
            let values = headers[name]
            if !values.isEmpty { picked[name] = values.joined(separator: name == "cookie" ? "; " : ", ") }
        }
        return picked
    }
}
