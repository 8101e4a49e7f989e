import Bayeux
import Logging
import NIOCore
import NIOHTTP1
import NIOSSL
import NIOWebSocket
import PubSubCore

/// The publish rate limits of the HTTP transports (429 and `X-RateLimit-*` headers), and how connection problems
/// are reported.
extension HTTPHandler {
    /// The client's address: the connection's peer, or behind a trusted proxy (`--trust-forwarded-for`) the last
    /// hop of `X-Forwarded-For`.
    static func clientAddress(_ head: HTTPRequestHead, remoteAddress: String?, trustForwardedFor: Bool) -> String? {
        PublishLimitKeys.clientAddress(head.headers, remoteAddress: remoteAddress, trustForwardedFor: trustForwardedFor)
    }

    /// Checks the publish limits for a request; the headers go on its response whatever the verdict, and a
    /// refusal is answered with 429 instead of the request being handled.
    func checkPublishLimits(_ elements: [MessageBatch.Element], head: HTTPRequestHead, remoteAddress: String?)
        -> (headers: HTTPHeaders, refusal: HTTPResponse?)?
    {
        let operations = shared.operations
        let keys = PublishLimitKeys(
            head.headers, remoteAddress: remoteAddress, trustForwardedFor: operations.configuration.trustForwardedFor)
        guard let (verdict, cost, explanation) = operations.checkPublishLimits(elements, keys: keys) else { return nil }
        var headers = HTTPHeaders()
        headers.add(name: "X-RateLimit-Limit", value: String(verdict.limit))
        headers.add(name: "X-RateLimit-Remaining", value: String(verdict.remaining))
        headers.add(name: "X-RateLimit-Reset", value: String(verdict.resetSeconds))
        guard let explanation else { return (headers, nil) }
        var refusal = headers
        refusal.add(name: "Retry-After", value: String(verdict.retryAfterSeconds))
        refusal.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        let text = "\(explanation); this request has \(cost); retry after \(verdict.retryAfterSeconds) s\n"
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
            shared.logger.info(
                "malformed HTTP request", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
        case let ssl as NIOSSLError:
            if case .handshakeFailed = ssl { return true }  // logged by TLSErrorLogger
            metrics.error(.connection)
            shared.logger.debug(
                "TLS connection ended", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
        case is IOError:
            metrics.error(.connection)
            shared.logger.debug(
                "connection error", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
        default:
            metrics.error(.connection)
            shared.logger.info(
                "connection error", metadata: ["pubsub.remote": "\(remote)", "pubsub.error": "\(error)"])
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
