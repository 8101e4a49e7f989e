import NIOCore
import NIOHTTP1

/// A request once it has been read: its head, its body (bounded by `maxRequestBytes`), and its route, parsed once.
struct RoutedRequest {
    var head: HTTPRequestHead
    var body: ByteBuffer?
    var route: Route
    /// The IP address of the connection's peer (not yet `X-Forwarded-For`: the API decides whether to trust it).
    var peerAddress: String?
}

/// What a responder answers. The HTTP handler adds what every response carries: `Content-Length`,
/// `X-Content-Type-Options`, `Connection: close` when the connection ends, and the body left out on a HEAD.
struct HTTPResponse {
    var status: HTTPResponseStatus
    var headers: HTTPHeaders
    var body: ByteBuffer
    /// Whether the request's `Origin` is echoed with credentials allowed (CORS). The API and the dashboard say no,
    /// so that no other site's page reads their answers.
    var crossOrigin = true

    /// A `text/plain` response.
    static func text(_ status: HTTPResponseStatus, _ text: String) -> HTTPResponse {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        return HTTPResponse(status: status, headers: headers, body: ByteBuffer(string: text))
    }
}

/// A responder's answer: at once, or once the engine or the metrics registry has answered.
enum HTTPReply {
    case now(HTTPResponse)
    case later(EventLoopFuture<HTTPResponse>)
}

/// Answers the requests of one kind of route (health, metrics, the API, the dashboard, static files). A
/// responder writes nothing itself: the HTTP handler writes what it answers.
protocol HTTPResponder {
    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply
}
