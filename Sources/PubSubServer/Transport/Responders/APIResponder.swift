import NIOCore
import NIOHTTP1

/// `/api/<call>`: the server API (`ServerAPI`), same origin only.
struct APIResponder: HTTPResponder {
    let api: ServerAPI
    /// Behind a trusted proxy the client's address is the last `X-Forwarded-For` hop (`--trust-forwarded-for`).
    let trustForwardedFor: Bool

    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply {
        guard case .api(let call) = request.route else {
            preconditionFailure("APIResponder asked for \(request.route)")
        }
        let address = HTTPHandler.clientAddress(
            request.head, remoteAddress: request.peerAddress, trustForwardedFor: trustForwardedFor)
        return .later(
            api.respond(call: call, head: request.head, body: request.body, address: address, on: loop).map {
                HTTPResponse(status: $0.status, headers: $0.headers, body: $0.body, crossOrigin: false)
            })
    }
}
