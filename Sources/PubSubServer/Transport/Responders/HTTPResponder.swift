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

/// What a response needs from its request's head: a few fields instead of the head's headers and URI, kept
/// while the request is handled (a parked connect keeps this, not the head).
struct ResponseTarget {
    var version: HTTPVersion
    var keepAlive: Bool
    var isHEAD: Bool
    /// The request's `Origin`, echoed on CORS responses.
    var origin: String?

    init(_ head: HTTPRequestHead) {
        version = head.version
        keepAlive = head.isKeepAlive
        isHEAD = head.method == .HEAD
        origin = head.headers.first(name: "origin")
    }

    /// The head of `response` with what every response carries (CORS, `Content-Length`, `nosniff`, `Connection:
    /// close` unless `keepAlive`), and the body to send (none for a HEAD or an empty one).
    func complete(_ response: HTTPResponse, keepAlive: Bool) -> (HTTPResponseHead, ByteBuffer?) {
        var headers = response.headers
        if response.crossOrigin, let origin {
            headers.add(name: "Access-Control-Allow-Origin", value: origin)
            headers.add(name: "Access-Control-Allow-Credentials", value: "true")
        }
        // The length a GET would have, on a HEAD too, whose body is not sent.
        headers.add(name: "Content-Length", value: String(response.body.readableBytes))
        if !headers.contains(name: "x-content-type-options") {
            headers.add(name: "X-Content-Type-Options", value: "nosniff")
        }
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        let sendsBody = response.body.readableBytes > 0 && !isHEAD
        return (
            HTTPResponseHead(version: version, status: response.status, headers: headers),
            sendsBody ? response.body : nil
        )
    }
}
