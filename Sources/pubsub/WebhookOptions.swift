import ArgumentParser
import NIOCore
import PubSubCore
import PubSubWebhooks

/// `--webhook URL …`: session events (handshake, subscribe, unsubscribe, disconnect) posted in signed batches.
struct WebhookOptions: ParsableArguments {
    @Option(help: "POST session events to this http(s) URL; repeatable (PUBSUB_WEBHOOK, comma-separated).")
    var webhook: [String] = []
    @Option(
        help:
            "Comma-separated events to post: handshake, subscribe, unsubscribe, disconnect; default all (PUBSUB_WEBHOOK_EVENTS)."
    )
    var webhookEvents: String?
    @Option(
        help: "Key of the X-Pubsub-Signature HMAC-SHA256 of each body; required with --webhook (PUBSUB_WEBHOOK_SECRET)."
    )
    var webhookSecret: String?
    @Option(
        help:
            "Events held per webhook URL while they wait or are retried; more are dropped and counted (PUBSUB_WEBHOOK_QUEUE, default 10000)."
    )
    var webhookQueue: Int?

    /// The webhook configuration, or nil when no URL is set.
    func resolve() throws -> WebhookConfiguration? {
        let urls =
            webhook.isEmpty
            ? (Environment.string("PUBSUB_WEBHOOK") ?? "").split(separator: ",").map {
                String($0).trimmingWhitespace()
            }.filter { !$0.isEmpty }
            : webhook
        for url in urls {
            if let problem = WebhookConfiguration.problem(with: url) {
                throw ValidationError("--webhook \(url.redactingUserInfo()) \(problem)")
            }
        }
        var events = Set(SessionEvent.Kind.allCases)
        if let list = webhookEvents ?? Environment.string("PUBSUB_WEBHOOK_EVENTS") {
            events = []
            for name in list.split(separator: ",").map({ String($0).trimmingWhitespace() }) where !name.isEmpty {
                guard let kind = SessionEvent.Kind(rawValue: name) else {
                    throw ValidationError(
                        "--webhook-events: unknown event '\(name)' (handshake, subscribe, unsubscribe, disconnect)")
                }
                events.insert(kind)
            }
            if events.isEmpty { throw ValidationError("--webhook-events names no event") }
        }
        var queue = WebhookQueueSettings()
        if let capacity = try Environment.pick(webhookQueue, "PUBSUB_WEBHOOK_QUEUE") {
            guard capacity > 0 else { throw ValidationError("--webhook-queue must be a positive number") }
            queue.capacity = capacity
        }
        let secret = webhookSecret ?? Environment.string("PUBSUB_WEBHOOK_SECRET")
        guard !urls.isEmpty else {
            if webhookSecret != nil || webhookEvents != nil || webhookQueue != nil {
                throw ValidationError("--webhook-secret, --webhook-events and --webhook-queue need --webhook")
            }
            return nil
        }
        guard let secret, !secret.isEmpty else {
            throw ValidationError("--webhook needs --webhook-secret (or PUBSUB_WEBHOOK_SECRET) to sign its posts")
        }
        return WebhookConfiguration(urls: urls, events: events, secret: secret, queue: queue)
    }
}

extension String {
    fileprivate func trimmingWhitespace() -> String {
        String(drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
    }

    /// `http://user:pass@host/x` → `http://host/x`, for error messages.
    fileprivate func redactingUserInfo() -> String {
        let scheme = prefix { $0 != ":" }
        let rest = dropFirst(scheme.count)
        guard rest.hasPrefix("://") else { return self }
        let afterScheme = rest.dropFirst(3)
        let authority = afterScheme.prefix { $0 != "/" }
        guard let at = authority.lastIndex(of: "@") else { return self }
        return scheme + "://" + afterScheme[afterScheme.index(after: at)...]
    }
}
