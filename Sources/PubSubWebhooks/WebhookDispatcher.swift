import AsyncHTTPClient
import CoreMetrics
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import PubSubCore
import ServiceLifecycle

/// Posts session events to the configured webhooks. The engine hands events over with `sessionEvents` (a lock
/// and an append per endpoint, never I/O, never waiting); one task per endpoint batches, signs and posts them,
/// retrying with backoff. Each endpoint's queue is bounded: what does not fit is dropped and counted on
/// `/metrics`. On drain (SIGTERM) the queues are flushed for at most `drainTimeout`, then dropped.
public final class WebhookDispatcher: SessionEventObserver, Service {
    public let configuration: WebhookConfiguration
    private let logger: Logger
    private let endpoints: [Endpoint]
    private let drainDeadline = NIOLockedValueBox<NIODeadline?>(nil)
    /// How often an endpoint with nothing due looks at its queue again.
    private let pollInterval: TimeAmount = .milliseconds(50)

    private let droppedFull = Counter(label: "pubsub_webhook_events_dropped_total", dimensions: [("reason", "queue_full")])
    private let droppedFailed = Counter(label: "pubsub_webhook_events_dropped_total", dimensions: [("reason", "failed")])
    private let postsOK = Counter(label: "pubsub_webhook_posts_total", dimensions: [("result", "ok")])
    private let postsFailed = Counter(label: "pubsub_webhook_posts_total", dimensions: [("result", "failed")])
    private let eventsSent = Counter(label: "pubsub_webhook_events_sent_total")

    final class Endpoint: Sendable {
        let url: String
        /// The URL without user info, path or query: what logs show.
        let label: String
        let queue: NIOLockedValueBox<WebhookQueue<ByteBuffer>>

        init(url: String, settings: WebhookQueueSettings) {
            self.url = url
            let scheme = url.prefix { $0 != ":" }
            let authority = url.dropFirst(scheme.count + 3).prefix { $0 != "/" && $0 != "?" && $0 != "#" }
            self.label = "\(scheme)://\(authority.split(separator: "@").last ?? "")"
            self.queue = NIOLockedValueBox(WebhookQueue(settings: settings))
        }
    }

    public init(configuration: WebhookConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        self.endpoints = configuration.urls.map { Endpoint(url: $0, settings: configuration.queue) }
    }

    // MARK: SessionEventObserver

    public func sessionEvents(_ events: [SessionEvent]) {
        let wanted = events.filter { configuration.events.contains($0.kind) }
        guard !wanted.isEmpty else { return }
        let now = NIODeadline.now()
        let stamp = Date.now.formatted(Self.timestampStyle)
        let encoded = wanted.map { WebhookPayload.encode($0, at: stamp) }
        for endpoint in endpoints {
            let refused = endpoint.queue.withLockedValue { queue in
                encoded.reduce(0) { $0 + (queue.append($1, now: now) ? 0 : 1) }
            }
            if refused > 0 { droppedFull.increment(by: refused) }
        }
    }

    static let timestampStyle = Date.ISO8601FormatStyle(includingFractionalSeconds: true)

    // MARK: Service

    public func run() async throws {
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        await withGracefulShutdownHandler {
            await withTaskGroup(of: Void.self) { group in
                for endpoint in endpoints {
                    group.addTask { await self.run(endpoint, client: client) }
                }
            }
        } onGracefulShutdown: {
            self.drainDeadline.withLockedValue { $0 = .now() + self.configuration.drainTimeout }
            for endpoint in self.endpoints { endpoint.queue.withLockedValue { $0.flush() } }
        }
        try? await client.shutdown()
    }

    private func run(_ endpoint: Endpoint, client: HTTPClient) async {
        while !Task.isCancelled {
            let now = NIODeadline.now()
            let deadline = drainDeadline.withLockedValue { $0 }
            let (action, flushing, empty) = endpoint.queue.withLockedValue { queue in
                (queue.next(now: now), queue.flushing, queue.isEmpty)
            }
            if flushing && empty { return }
            if flushing, let deadline, now >= deadline {
                let lost = endpoint.queue.withLockedValue { $0.dropAll() }
                if lost > 0 {
                    droppedFailed.increment(by: lost)
                    logger.warning(
                        "webhook events dropped at shutdown",
                        metadata: ["pubsub.webhook.url": "\(endpoint.label)", "pubsub.webhook.events": "\(lost)"])
                }
                return
            }
            switch action {
            case .idle:
                try? await Task.sleep(nanoseconds: UInt64(pollInterval.nanoseconds))
            case .wait(let until):
                let wait = min(until - now, pollInterval)
                try? await Task.sleep(nanoseconds: UInt64(max(wait.nanoseconds, 1_000_000)))
            case .send(let batch, let attempt):
                let ok = await post(batch, to: endpoint, attempt: attempt, client: client)
                if ok {
                    postsOK.increment()
                    eventsSent.increment(by: batch.count)
                    endpoint.queue.withLockedValue { $0.succeeded() }
                } else {
                    postsFailed.increment()
                    let lost = endpoint.queue.withLockedValue { $0.failed(now: .now()) }
                    if lost > 0 {
                        droppedFailed.increment(by: lost)
                        logger.warning(
                            "webhook batch given up",
                            metadata: [
                                "pubsub.webhook.url": "\(endpoint.label)", "pubsub.webhook.events": "\(lost)",
                                "pubsub.webhook.attempts": "\(attempt)",
                            ])
                    }
                }
            }
        }
    }

    private func post(_ batch: [ByteBuffer], to endpoint: Endpoint, attempt: Int, client: HTTPClient) async -> Bool {
        let body = WebhookPayload.body(batch)
        var request = HTTPClientRequest(url: endpoint.url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "User-Agent", value: "pubsub-webhooks")
        request.headers.add(
            name: WebhookSignature.header,
            value: WebhookSignature.sign(body.readableBytesView, secret: configuration.secret))
        request.body = .bytes(body)
        do {
            let response = try await client.execute(request, timeout: configuration.requestTimeout, logger: logger)
            _ = try? await response.body.collect(upTo: 64 * 1024)
            if (200 ..< 300).contains(response.status.code) { return true }
            logger.debug(
                "webhook post refused",
                metadata: [
                    "pubsub.webhook.url": "\(endpoint.label)", "pubsub.webhook.status": "\(response.status.code)",
                    "pubsub.webhook.attempt": "\(attempt)",
                ])
        } catch {
            logger.debug(
                "webhook post failed",
                metadata: [
                    "pubsub.webhook.url": "\(endpoint.label)", "pubsub.webhook.error": "\(error)",
                    "pubsub.webhook.attempt": "\(attempt)",
                ])
        }
        return false
    }
}
