import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import NIOSSL
import NIOWebSocket
import PubSubCore

/// The publish rate limits of the HTTP transports, and how connection problems are reported.
extension HTTPHandler {
    /// How many messages of a request are publishes (not meta channels): what the rate limit counts.
    static func publishCount(_ elements: [MessageBatch.Element]) -> Int {
        var n = 0
        for case .message(let message) in elements {
            if let channel = message.channel, !Channel.isMeta(channel) { n += 1 }
        }
        return n
    }

    /// The token a publish request is limited by: `Authorization: Bearer …`, else the first publish's
    /// `ext.private_pub_token` (PrivatePub's server-side publish) or `ext.token`.
    static func publishToken(_ head: HTTPRequestHead, _ elements: [MessageBatch.Element]) -> String? {
        if let authorization = head.headers.first(name: "authorization") {
            let parts = authorization.split(separator: " ", maxSplits: 1)
            if parts.count == 2, parts[0].lowercased() == "bearer" { return String(parts[1]) }
        }
        for case .message(let message) in elements {
            guard let channel = message.channel, !Channel.isMeta(channel), let ext = message.ext else { continue }
            if let token = ext["private_pub_token"]?.stringValue ?? ext["token"]?.stringValue { return token }
        }
        return nil
    }

    /// The client's address: the connection's peer, or behind a trusted proxy (`--trust-forwarded-for`) the last
    /// hop of `X-Forwarded-For`.
    static func clientAddress(_ head: HTTPRequestHead, remoteAddress: String?, trustForwardedFor: Bool) -> String? {
        if trustForwardedFor, let forwarded = head.headers["x-forwarded-for"].last?.split(separator: ",").last {
            return forwarded.trimmed(of: " \t")
        }
        return remoteAddress
    }

    /// Checks the publish limits for a request; the headers go on its response whatever the verdict, and a
    /// refusal is answered with 429 instead of the request being handled.
    func checkPublishLimits(_ elements: [MessageBatch.Element], head: HTTPRequestHead, remoteAddress: String?)
        -> (headers: HTTPHeaders, refusal: HTTPResponse?)?
    {
        let operations = shared.operations
        guard let limiter = operations.limiter else { return nil }
        let cost = Self.publishCount(elements)
        guard cost > 0 else { return nil }
        let ip = Self.clientAddress(head, remoteAddress: remoteAddress, trustForwardedFor: operations.configuration.trustForwardedFor)
        guard
            let (verdict, scope) = limiter.check(
                ip: ip, token: Self.publishToken(head, elements), cost: cost, now: .now())
        else { return nil }
        var headers = HTTPHeaders()
        headers.add(name: "X-RateLimit-Limit", value: String(verdict.limit))
        headers.add(name: "X-RateLimit-Remaining", value: String(verdict.remaining))
        headers.add(name: "X-RateLimit-Reset", value: String(verdict.resetSeconds))
        guard !verdict.allowed else { return (headers, nil) }
        operations.metrics.rateLimited[scope]?.increment()
        operations.noteRefusal(connection: false)
        var refusal = headers
        refusal.add(name: "Retry-After", value: String(verdict.retryAfterSeconds))
        refusal.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        let per = scope == .ip ? "client address" : "publish token"
        let window = operations.configuration.publishWindow
        let seconds = Double(window.nanoseconds) / 1e9
        let text =
            "Publish rate limit exceeded: \(verdict.limit) messages per \(seconds == 1 ? "second" : "\(seconds) seconds") "
            + "per \(per); this request has \(cost); retry after \(verdict.retryAfterSeconds) s\n"
        return (headers, HTTPResponse(status: .tooManyRequests, headers: refusal, body: ByteBuffer(string: text)))
    }

    /// One log line per connection that fails, and the matching `pubsub_request_errors_total` kind. Resets and
    /// unclean TLS shutdowns are what clients that go away do: counted, logged at debug only. Returns whether
    /// the connection is to be closed.
    func reportConnectionError(_ error: any Error, context: ChannelHandlerContext, alreadyReported: Bool) -> Bool {
        // An upgrade to a path outside the mount: the request goes on as plain HTTP (and gets a 404).
        if error is NIOWebSocketUpgradeError { return false }
        if alreadyReported { return true }
        let remote = context.channel.remoteAddress?.description ?? "?"
        let metrics = shared.operations.metrics
        switch error {
        case HTTPParserError.invalidEOFState:
            // The client went away in the middle of a request.
            metrics.error(.connection)
            shared.logger.debug("connection closed mid-request", metadata: ["pubsub.remote": "\(remote)"])
        case is HTTPParserError:
            metrics.error(.badRequest)
            shared.logger.info("malformed HTTP request", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
        case let ssl as NIOSSLError:
            if case .handshakeFailed = ssl { return true }  // logged by TLSErrorLogger
            metrics.error(.connection)
            shared.logger.debug("TLS connection ended", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
        case is IOError:
            metrics.error(.connection)
            shared.logger.debug("connection error", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
        default:
            metrics.error(.connection)
            shared.logger.info("connection error", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
        }
        return true
    }
}

extension Substring {
    func trimmed(of set: String) -> String {
        var slice = self[...]
        while let first = slice.first, set.contains(first) { slice = slice.dropFirst() }
        while let last = slice.last, set.contains(last) { slice = slice.dropLast() }
        return String(slice)
    }
}
