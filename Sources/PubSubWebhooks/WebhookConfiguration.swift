import NIOCore
import PubSubCore

/// What `serve --webhook …` asks for. The secret is never logged nor described.
public struct WebhookConfiguration: Sendable {
    /// Every endpoint gets every selected event, each through its own queue.
    public var urls: [String]
    public var events: Set<SessionEvent.Kind>
    public var secret: String
    public var queue: WebhookQueueSettings
    /// How long one POST may take before it counts as failed.
    public var requestTimeout: TimeAmount
    /// On drain, how long queued events may still be posted before the rest is dropped.
    public var drainTimeout: TimeAmount

    public init(
        urls: [String],
        events: Set<SessionEvent.Kind> = Set(SessionEvent.Kind.allCases),
        secret: String,
        queue: WebhookQueueSettings = .init(),
        requestTimeout: TimeAmount = .seconds(5),
        drainTimeout: TimeAmount = .seconds(5)
    ) {
        self.urls = urls
        self.events = events
        self.secret = secret
        self.queue = queue
        self.requestTimeout = requestTimeout
        self.drainTimeout = drainTimeout
    }

    /// Why a webhook URL is refused, or nil: only absolute `http://` or `https://` URLs with a host.
    public static func problem(with url: String) -> String? {
        let lower = url.lowercased()
        let rest: Substring
        if lower.hasPrefix("http://") {
            rest = url.dropFirst(7)
        } else if lower.hasPrefix("https://") {
            rest = url.dropFirst(8)
        } else {
            return "must be an http:// or https:// URL"
        }
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        let host = authority.split(separator: "@").last.map { $0.prefix { $0 != ":" } } ?? ""
        if host.isEmpty && !authority.hasPrefix("[") { return "has no host" }
        if url.contains(where: { $0 == " " || $0.isNewline }) { return "contains white space" }
        return nil
    }
}
