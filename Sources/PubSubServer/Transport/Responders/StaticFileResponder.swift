import NIOCore
import NIOHTTP1

/// The static files under the mount (`StaticFiles`): the browser client.
struct StaticFileResponder: HTTPResponder {
    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply {
        guard case .staticFile(let name) = request.route,
            let file = StaticFiles.response(
                name: name, method: request.head.method, requestHeaders: request.head.headers)
        else {
            // Not the name asked for: request input is never echoed.
            return .now(.text(.notFound, "Not found\n"))
        }
        return .now(file)
    }
}
