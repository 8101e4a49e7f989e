import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import PubSubCore

/// What a request to the Bayeux mount asks for, read from its head and body alone: messages to handle
/// (long-polling and cross-origin POSTs, JSON-P GETs), an EventSource stream, or an answer given at once (a
/// preflight, a refusal, a bad request). The `HTTPHandler` does what it says.
enum BayeuxHTTPRequest {
    /// Messages as JSON text; `jsonp`, the callback of a JSON-P GET.
    case messages([UInt8], jsonp: String?)
    case eventSource(clientId: String)
    case respond(HTTPResponse)
    /// A 400, with the reason for the log.
    case badRequest(String)

    init(_ request: RoutedRequest, configuration: ServerConfiguration, logger: Logger) {
        let head = request.head
        if head.method == .HEAD {
            // A HEAD carries no message to run and opens no stream; saying so is the honest answer.
            var headers = HTTPHeaders()
            headers.add(name: "Allow", value: "GET, POST, OPTIONS")
            headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
            self = .respond(
                HTTPResponse(
                    status: .methodNotAllowed, headers: headers, body: ByteBuffer(string: "Method not allowed\n")))
        } else if let refusal = Self.browserAccessRefusal(head, configuration: configuration, logger: logger) {
            var forbidden = HTTPResponse.text(.forbidden, refusal)
            forbidden.crossOrigin = false
            self = .respond(forbidden)
        } else if head.method == .OPTIONS || head.headers.contains(name: "access-control-request-method") {
            self = .respond(Self.preflight(head))
        } else if head.method == .GET,
            head.headers["accept"].contains(where: { $0.lowercased().contains("text/event-stream") })
        {
            guard case .bayeuxWithSuffix(let clientId) = request.route, !clientId.isEmpty else {
                self = .badRequest("EventSource URL must end in the client id")
                return
            }
            self = .eventSource(clientId: clientId)
        } else if head.method == .GET {
            self = Self.callbackPolling(head)
        } else {
            self = Self.longPolling(head, body: request.body)
        }
    }

    /// Why a browser request to the mount path is refused (403), or nil: an `Origin` outside `--allowed-origins`
    /// (a preflight included, so it gets no `Access-Control-Allow-*`), or JSON-P when callback-polling is off.
    static func browserAccessRefusal(_ head: HTTPRequestHead, configuration: ServerConfiguration, logger: Logger)
        -> String?
    {
        if !configuration.origins.allows(head.headers) {
            logger.debug("origin refused", metadata: ["pubsub.origin": "\(head.headers.first(name: "origin") ?? "")"])
            return "Origin not allowed\n"
        }
        // Callback-polling is a GET carrying its messages in `message=` (EventSource and WebSocket carry none).
        if !configuration.callbackPolling, head.method == .GET, head.uri.contains("message=") {
            return "Callback-polling (JSON-P) is disabled\n"
        }
        return nil
    }

    private static func preflight(_ head: HTTPRequestHead) -> HTTPResponse {
        var headers = HTTPHeaders()
        headers.add(name: "Access-Control-Allow-Credentials", value: "true")
        headers.add(
            name: "Access-Control-Allow-Headers", value: "Accept, Authorization, Content-Type, Pragma, X-Requested-With"
        )
        headers.add(name: "Access-Control-Allow-Methods", value: "POST, GET")
        let origin = head.headers.first(name: "origin") ?? head.headers.first(name: "referer") ?? "*"
        headers.add(name: "Access-Control-Allow-Origin", value: origin)
        headers.add(name: "Access-Control-Max-Age", value: "86400")
        return HTTPResponse(status: .ok, headers: headers, body: ByteBuffer(), crossOrigin: false)
    }

    private static func queryValue(_ name: String, in head: HTTPRequestHead) -> [UInt8]? {
        guard let q = head.uri.firstIndex(of: "?") else { return nil }
        return FormData.value(of: name, in: head.uri.utf8[head.uri.utf8.index(after: q)...])
    }

    /// A POST's messages: `message=` in the query, a JSON body, a form field, or a raw JSON body sent with
    /// another content type (curl -d sends a form type).
    private static func longPolling(_ head: HTTPRequestHead, body: ByteBuffer?) -> BayeuxHTTPRequest {
        if let fromQuery = queryValue("message", in: head) { return .messages(fromQuery, jsonp: nil) }
        let bodyBytes = body.map { Array($0.readableBytesView) } ?? []
        if isJSONContentType(head.headers.first(name: "content-type")) { return .messages(bodyBytes, jsonp: nil) }
        if let field = FormData.value(of: "message", in: bodyBytes) { return .messages(field, jsonp: nil) }
        if let firstByte = bodyBytes.first(where: { ![0x20, 0x09, 0x0A, 0x0D].contains($0) }),
            firstByte == UInt8(ascii: "{") || firstByte == UInt8(ascii: "[")
        {
            return .messages(bodyBytes, jsonp: nil)
        }
        return .badRequest("no message in request")
    }

    static func isJSONContentType(_ value: String?) -> Bool {
        guard let value else { return false }
        // What clients send, told without splitting and lowercasing.
        if value == "application/json" || value == "application/json; charset=utf-8" { return true }
        let media = value.split(separator: ";").first.map { String($0.filter { $0 != " " && $0 != "\t" }).lowercased() }
        return media == "application/json"
    }

    private static func callbackPolling(_ head: HTTPRequestHead) -> BayeuxHTTPRequest {
        guard let message = queryValue("message", in: head) else { return .badRequest("GET without message") }
        let callback = queryValue("jsonp", in: head) ?? Array("jsonpcallback".utf8)
        guard JSONPCallback.isValid(callback) else { return .badRequest("invalid JSON-P callback") }
        return .messages(message, jsonp: String(decoding: callback, as: UTF8.self))
    }
}

/// The bodies the Bayeux mount answers with: replies and events as JSON (or JSON-P), and EventSource framing.
enum BayeuxHTTPResponse {
    static func messages(
        replies: [Message], events: CircularBuffer<WireEvent>, jsonp: String?, allocator: ByteBufferAllocator
    ) -> HTTPResponse {
        var payload = ReplyEncoder.encode(replies: replies, events: events, allocator: allocator)
        var headers = HTTPHeaders()
        if let jsonp {
            payload = ReplyEncoder.escapeLineSeparators(payload, allocator: allocator)
            var wrapped = allocator.buffer(capacity: payload.readableBytes + jsonp.utf8.count + 8)
            wrapped.writeString("/**/\(jsonp)(")
            wrapped.writeBuffer(&payload)
            wrapped.writeString(");")
            payload = wrapped
            headers.add(name: "Content-Type", value: "text/javascript; charset=utf-8")
            headers.add(name: "Content-Disposition", value: "attachment; filename=f.txt")
        } else {
            headers.add(name: "Content-Type", value: "application/json; charset=utf-8")
        }
        headers.add(name: "Cache-Control", value: "no-cache, no-store")
        headers.add(name: "X-Content-Type-Options", value: "nosniff")
        return HTTPResponse(status: .ok, headers: headers, body: payload)
    }

    static let streamHeaders: HTTPHeaders = [
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache, no-store", "Connection": "close",
    ]
    /// The stream's first bytes: how long a browser waits before it reconnects.
    static let streamStart = ByteBuffer(string: "retry: 5000\r\n\r\n")
    static let dataPrefix = ByteBuffer(string: "data: ")
    static let eventEnd = ByteBuffer(string: "\r\n\r\n")
    static let heartbeat = ByteBuffer(string: ":\n\n")
}
