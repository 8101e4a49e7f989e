import Bayeux
import NIOCore
import NIOHTTP1

/// Who a publish is counted against, the same on every transport: the client's address and the bearer token of
/// the request (HTTP) or of the upgrade request (WebSocket). A publish's own `ext` token is read from each batch.
/// A class: a WebSocket keeps one only while limits are set, and a reference is all an idle socket pays.
final class PublishLimitKeys: Sendable {
    let address: String?
    let bearer: String?

    init(_ headers: HTTPHeaders, remoteAddress: String?, trustForwardedFor: Bool) {
        address = Self.clientAddress(headers, remoteAddress: remoteAddress, trustForwardedFor: trustForwardedFor)
        var bearer: String?
        if let authorization = headers.first(name: "authorization") {
            let parts = authorization.split(separator: " ", maxSplits: 1)
            if parts.count == 2, parts[0].lowercased() == "bearer" { bearer = String(parts[1]) }
        }
        self.bearer = bearer
    }

    /// The client's address: the connection's peer, or behind a trusted proxy (`--trust-forwarded-for`) the last
    /// hop of `X-Forwarded-For`.
    static func clientAddress(_ headers: HTTPHeaders, remoteAddress: String?, trustForwardedFor: Bool) -> String? {
        if trustForwardedFor, let forwarded = headers["x-forwarded-for"].last?.split(separator: ",").last {
            return forwarded.trimmed(of: " \t")
        }
        return remoteAddress
    }

    /// How many messages of a batch are publishes (not meta channels): what the rate limit counts.
    static func publishCount(_ elements: [MessageBatch.Element]) -> Int {
        var n = 0
        for case .message(let message) in elements {
            if let channel = message.channel, !Channel.isMeta(channel) { n += 1 }
        }
        return n
    }

    /// The token a batch is limited by: the bearer token, else the first publish's `ext.private_pub_token`
    /// (PrivatePub's server-side publish) or `ext.token`.
    func token(_ elements: [MessageBatch.Element]) -> String? {
        if let bearer { return bearer }
        for case .message(let message) in elements {
            guard let channel = message.channel, !Channel.isMeta(channel), let ext = message.ext else { continue }
            if let token = ext["private_pub_token"]?.stringValue ?? ext["token"]?.stringValue { return token }
        }
        return nil
    }
}

extension ServerOperations {
    /// Checks the publish limits for a batch (an HTTP request, a WebSocket frame): spends one token per publish
    /// in it from every bucket that applies, or none when a bucket refuses (the batch is refused whole). Nil when
    /// no limit applies. A refusal is counted and logged (at most every 10 s), and comes with its explanation
    /// (`Publish rate limit exceeded: 3 messages per second per client address`).
    func checkPublishLimits(_ elements: [MessageBatch.Element], keys: PublishLimitKeys)
        -> (verdict: TokenBuckets.Verdict, cost: Int, refusal: String?)?
    {
        guard let limiter else { return nil }
        let cost = PublishLimitKeys.publishCount(elements)
        guard cost > 0,
            let (verdict, scope) = limiter.check(ip: keys.address, token: keys.token(elements), cost: cost, now: .now())
        else { return nil }
        guard !verdict.allowed else { return (verdict, cost, nil) }
        metrics.rateLimited[scope]?.increment()
        noteRefusal(connection: false)
        let per = scope == .ip ? "client address" : "publish token"
        let seconds = Double(configuration.publishWindow.nanoseconds) / 1e9
        let window = seconds == 1 ? "second" : "\(seconds) seconds"
        return (verdict, cost, "Publish rate limit exceeded: \(verdict.limit) messages per \(window) per \(per)")
    }

    /// A batch that goes on whatever the limits say (a WebSocket frame), its publishes refused when they exceed
    /// them (the same buckets as HTTP's: a frame is refused whole, as a request is). A refused publish gets
    /// `successful: false` and `429:<channel>,<seconds to wait>:Publish rate limit exceeded` in its reply; the
    /// meta messages are handled as usual, so a connect sent with them is not lost.
    func admitted(_ elements: [MessageBatch.Element], keys: PublishLimitKeys?) -> [MessageBatch.Element] {
        guard let keys, let (verdict, _, refusal) = checkPublishLimits(elements, keys: keys), refusal != nil else {
            return elements
        }
        let retryAfter = String(verdict.retryAfterSeconds)
        return elements.map { element in
            guard case .message(var message) = element, let channel = message.channel, !Channel.isMeta(channel)
            else { return element }
            message.error = BayeuxError(Self.publishRateLimited, channel, retryAfter).description
            return .message(message)
        }
    }

    static let publishRateLimited = BayeuxError.Code(429, "Publish rate limit exceeded")
}
