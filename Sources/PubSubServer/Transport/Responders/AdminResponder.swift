import NIOCore
import NIOHTTP1

/// `/admin`: the dashboard page (`ServerAPI.adminPage`), same origin only.
struct AdminResponder: HTTPResponder {
    let api: ServerAPI

    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply {
        let page = api.adminPage(head: request.head)
        return .now(HTTPResponse(status: page.status, headers: page.headers, body: page.body, crossOrigin: false))
    }
}
