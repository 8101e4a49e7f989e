import AsyncHTTPClient
import Bayeux
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

    private let droppedFull = Counter(
        label: "pubsub_webhook_events_dropped_total", dimensions: [("reason", "queue_full")])
    private let droppedFailed = Counter(
        label: "pubsub_webhook_events_dropped_total", dimensions: [("reason", "failed")])
    private let postsOK = Counter(label: "pubsub_webhook_posts_total", dimensions: [("result", "ok")])
    private let postsFailed = Counter(label: "pubsub_webhook_posts_total", dimensions: [("result", "failed")])
    private let eventsSent = Counter(label: "pubsub_webhook_events_sent_total")

    /// One URL: its queue, and the sender task's wake-up when it waits.
    final class Endpoint: Sendable {
        /// The URL posted to, without its user info (sent as basic auth instead).
        let url: String
        let basicAuth: (username: String, password: String)?
        /// The URL without user info, path or query: what logs show.
        let label: String
        let state: NIOLockedValueBox<State>
        /// `pubsub_webhook_queue_depth{url}`: events held (pending and in flight).
        let depth: Gauge

        /// What wakes the sender before its time: events arriving (it is idle) or a batch filling up (it waits
        /// for a batch's delay, or for a retry's backoff, during which no batch is taken). A drain starting
        /// always does.
        enum Wake {
            case onEvents
            case onFullBatch
        }

        struct State {
            var queue: WebhookQueue<ByteBuffer>
            var waiter: (continuation: CheckedContinuation<Void, Never>, wake: Wake, flushing: Bool, id: UInt64)?
            /// Numbers the waits, so that a timer only ever wakes its own.
            var waits: UInt64 = 0

            /// Whether the waiting sender has something new to do.
            func shouldWake(_ wake: Wake, sawFlushing: Bool) -> Bool {
                if queue.flushing != sawFlushing { return true }
                switch wake {
                case .onEvents: return !queue.isEmpty
                case .onFullBatch: return queue.hasFullBatch
                }
            }

            /// Takes the waiter if it should wake now.
            mutating func waiterToWake() -> CheckedContinuation<Void, Never>? {
                guard let waiter, shouldWake(waiter.wake, sawFlushing: waiter.flushing) else { return nil }
                self.waiter = nil
                return waiter.continuation
            }
        }

        init(url: String, settings: WebhookQueueSettings) {
            let scheme = url.prefix { $0 != ":" }
            let rest = url.dropFirst(scheme.count + 3)
            let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
            // User and password are percent-encoded in a URL (`p%40ss` for `p@ss`); Basic auth sends them decoded.
            let parsed = try? URLAuthority(authority)
            if let at = authority.lastIndex(of: "@"), let user = parsed?.user {
                self.basicAuth = (
                    PercentDecoding.decodeLeniently(user), PercentDecoding.decodeLeniently(parsed?.password ?? "")
                )
                self.url = "\(scheme)://" + rest[rest.index(after: at)...]
            } else {
                self.basicAuth = nil
                self.url = url
            }
            self.label = "\(scheme)://\(authority.split(separator: "@").last ?? "")"
            self.state = NIOLockedValueBox(State(queue: WebhookQueue(settings: settings)))
            self.depth = Gauge(label: "pubsub_webhook_queue_depth", dimensions: [("url", label)])
        }

        /// Resumes the waiting sender, whatever it waits for (its time came, or the task is cancelled); with `id`,
        /// only if that wait is still the current one.
        func wakeUp(_ id: UInt64? = nil) {
            let waiter = state.withLockedValue { s -> CheckedContinuation<Void, Never>? in
                guard let waiter = s.waiter, id == nil || waiter.id == id else { return nil }
                s.waiter = nil
                return waiter.continuation
            }
            waiter?.resume()
        }

        /// Waits until `until` (nil: no time limit) or until `wake` says there is something to do.
        func wait(_ wake: Wake, until: NIODeadline?, sawFlushing: Bool) async {
            var timer: Task<Void, Never>?
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let id = state.withLockedValue { s -> UInt64? in
                        if Task.isCancelled || s.shouldWake(wake, sawFlushing: sawFlushing) { return nil }
                        s.waits += 1
                        s.waiter = (continuation, wake, sawFlushing, s.waits)
                        return s.waits
                    }
                    guard let id else {
                        continuation.resume()
                        return
                    }
                    if let until {
                        timer = Task {
                            let nanoseconds = (until - .now()).nanoseconds
                            if nanoseconds > 0 {
                                do { try await Task.sleep(nanoseconds: UInt64(nanoseconds)) } catch { return }
                            }
                            self.wakeUp(id)
                        }
                    }
                }
            } onCancel: {
                self.wakeUp()
            }
            timer?.cancel()
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
            let (refused, waiter, depth) = endpoint.state.withLockedValue { s in
                (encoded.reduce(0) { $0 + (s.queue.append($1, now: now) ? 0 : 1) }, s.waiterToWake(), s.queue.count)
            }
            waiter?.resume()
            endpoint.depth.record(depth)
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
            for endpoint in self.endpoints {
                let waiter = endpoint.state.withLockedValue { s in
                    s.queue.flush()
                    return s.waiterToWake()
                }
                waiter?.resume()
            }
        }
        try? await client.shutdown()
    }

    private func run(_ endpoint: Endpoint, client: HTTPClient) async {
        while !Task.isCancelled {
            let now = NIODeadline.now()
            let deadline = drainDeadline.withLockedValue { $0 }
            let (action, flushing, empty, depth) = endpoint.state.withLockedValue { s in
                (s.queue.next(now: now), s.queue.flushing, s.queue.isEmpty, s.queue.count)
            }
            endpoint.depth.record(depth)
            if flushing && empty { return }
            if flushing, let deadline, now >= deadline {
                let lost = endpoint.state.withLockedValue { $0.queue.dropAll() }
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
                await endpoint.wait(.onEvents, until: flushing ? deadline : nil, sawFlushing: flushing)
            case .wait(let until):
                // A batch waiting for its delay goes as soon as it is full (never the case while a batch waits
                // for its retry); nothing waits beyond the drain's deadline.
                let limit = flushing ? min(until, deadline ?? until) : until
                await endpoint.wait(.onFullBatch, until: limit, sawFlushing: flushing)
            case .send(let batch, let attempt):
                // During the drain no post outlives its deadline.
                var timeout = configuration.requestTimeout
                if flushing, let deadline { timeout = max(min(timeout, deadline - now), .milliseconds(1)) }
                let ok = await post(batch, to: endpoint, attempt: attempt, timeout: timeout, client: client)
                if ok {
                    postsOK.increment()
                    eventsSent.increment(by: batch.count)
                    endpoint.state.withLockedValue { $0.queue.succeeded() }
                } else {
                    postsFailed.increment()
                    let lost = endpoint.state.withLockedValue { $0.queue.failed(now: .now()) }
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

    private func post(
        _ batch: [ByteBuffer], to endpoint: Endpoint, attempt: Int, timeout: TimeAmount, client: HTTPClient
    )
        async -> Bool
    {
        let body = WebhookPayload.body(batch)
        var request = HTTPClientRequest(url: endpoint.url)
        request.method = .POST
        if let auth = endpoint.basicAuth { request.setBasicAuth(username: auth.username, password: auth.password) }
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "User-Agent", value: "pubsub-webhooks")
        request.headers.add(
            name: WebhookSignature.header,
            value: WebhookSignature.sign(body.readableBytesView, secret: configuration.secret))
        request.body = .bytes(body)
        do {
            let response = try await client.execute(request, timeout: timeout, logger: logger)
            _ = try? await response.body.collect(upTo: 64 * 1024)
            if (200..<300).contains(response.status.code) { return true }
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
