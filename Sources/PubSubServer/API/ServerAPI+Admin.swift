import NIOCore
import NIOHTTP1

extension ServerAPI {
    /// `/admin`: 404 without a configured key. The page holds no data: it asks for the key and then talks only
    /// to `/api`. A request without the key gets it with 401 (a browser's first visit: the page shows its key
    /// form); with `Authorization: apikey KEY`, 200.
    func adminPage(head: HTTPRequestHead) -> Response {
        guard let key else { return Self.notFound }
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/html; charset=utf-8")
        headers.add(name: "Cache-Control", value: "no-store")
        headers.add(
            name: "Content-Security-Policy",
            value:
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        )
        headers.add(name: "Referrer-Policy", value: "no-referrer")
        let status: HTTPResponseStatus = Self.authorized(head.headers, key: key) ? .ok : .unauthorized
        return Response(status: status, headers: headers, body: ByteBuffer(string: AdminPage.html))
    }
}
