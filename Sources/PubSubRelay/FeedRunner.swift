import Bayeux
import CoreMetrics
import Logging
import NIOConcurrencyHelpers
import NIOCore

/// Publishes by handing Bayeux publish messages to a function that returns the broker's replies in order (the
/// in-process broker of `pubsub serve --relay`). Sends `batchSize` messages at a time; done only when every reply
/// is successful.
public struct MessagePublisher: Publisher {
    public typealias Send = @Sendable ([Message]) async throws -> [Message]

    let token: String?
    let jwt: String?
    let batchSize: Int
    let send: Send

    /// `token` is the broker's secret, sent as `ext.private_pub_token` as every publisher does; `jwt` is sent as
    /// `ext.token`, for a broker that takes JWTs only.
    public init(token: String?, jwt: String? = nil, batchSize: Int, send: @escaping Send) {
        self.token = token
        self.jwt = jwt
        self.batchSize = max(1, batchSize)
        self.send = send
    }

    public func publish(_ messages: [RelayMessage]) async throws {
        var start = 0
        while start < messages.count {
            let chunk = messages[start..<min(messages.count, start + batchSize)]
            start += chunk.count
            let requests = chunk.map { relayed -> Message in
                var message = Message()
                message.fields["channel"] = .string(relayed.channel)
                message.fields["data"] = relayed.data
                var ext = JSONObject()
                if let token { ext["private_pub_token"] = .string(token) }
                if let jwt { ext["token"] = .string(jwt) }
                if !ext.isEmpty { message.fields["ext"] = .object(ext) }
                return message
            }
            let replies = try await send(requests)
            guard replies.count == requests.count else {
                throw RelayError(.publish, "the broker answered \(replies.count) of \(requests.count) messages")
            }
            let refused = replies.indices.filter { replies[$0].fields["successful"] != .bool(true) }
            if let first = refused.first {
                throw RelayError(
                    .publish,
                    "the broker refused \(refused.count) of \(replies.count) messages (first on \(chunk[chunk.startIndex + first].channel): \(replies[first].error ?? "refused"))"
                )
            }
        }
    }
}

/// Runs one feed of a relay file until cancelled: a relay over a new source, restarted after any error with a
/// pause that doubles from 1 s up to 30 s (back to 1 s after a minute without error). One feed failing (its
/// database down, a refused checkpoint) never stops the others or the broker; every failure is logged at error
/// level and counted in `pubsub_relay_restarts_total`.
public struct FeedRunner: Sendable {
    public var feed: RelayFile.Feed
    public var publisher: any Publisher
    public var logger: Logger
    /// Where the feed says what it is doing (`serve --relay`'s `/readyz`); nil: nowhere but the log.
    public var health: RelayHealth?
    /// How often a running feed's source is asked whether it is behind, for `health`.
    public var healthInterval: Duration = .seconds(1)
    /// Builds the feed's source for each run (tests hand in their own).
    var makeSource: @Sendable (RelayFile.Feed, Logger) throws -> any ChangeSource = { feed, logger in
        try feed.makeSource(logger: logger)
    }

    public init(feed: RelayFile.Feed, publisher: any Publisher, health: RelayHealth? = nil, logger: Logger) {
        self.feed = feed
        self.publisher = publisher
        self.health = health
        var logger = logger
        logger[metadataKey: "pubsub.relay.feed"] = "\(feed.name)"
        self.logger = logger
    }

    public func run() async {
        var backoff = Backoff(initial: Duration.seconds(1), maximum: .seconds(30))
        while !Task.isCancelled {
            let source: any ChangeSource
            do {
                source = try makeSource(feed, logger)
            } catch {
                logger.critical("relay feed cannot be built: \(error)")
                health?.set(feed.name, .stopped("cannot be built: \(error)"))
                return
            }
            let relay = Relay(
                source: source, publisher: publisher, store: FileCheckpointStore(path: feed.checkpoint),
                configuration: .init(
                    mapping: feed.mapping, audiencePath: feed.checkpoint + ".audience",
                    rememberedDocuments: feed.rememberedDocuments),
                logger: logger)
            let began = ContinuousClock.now
            do {
                try await run(relay, source: source)
            } catch is CancellationError where Task.isCancelled {
            } catch let error as RelayError where error.code == .configuration {
                // The database refuses the feed as configured (a routed table's replica identity): no restart
                // can mend that.
                logger.critical(
                    "relay feed stopped: \(error.message)", metadata: ["pubsub.relay.source": "\(source.sourceID)"])
                health?.set(feed.name, .stopped(error.message))
                await source.close()
                return
            } catch {
                if ContinuousClock.now - began > .seconds(60) { backoff.reset() }
                health?.set(feed.name, .restarting(source.describe(error)))
                if !Task.isCancelled {
                    Counter(label: "pubsub_relay_restarts_total", dimensions: [("source", source.sourceID)]).increment()
                    logger.error(
                        "relay feed stopped on an error; restarting it",
                        metadata: [
                            "pubsub.relay.source": "\(source.sourceID)", "pubsub.relay.error": "\(error)",
                            "pubsub.relay.retry_in": "\(backoff.current)",
                        ])
                }
            }
            await source.close()
            if Task.isCancelled { return }
            if ContinuousClock.now - began > .seconds(60) { backoff.reset() }
            try? await backoff.wait()
        }
    }

    /// Runs the relay; with `health`, beside it asks the source every `healthInterval` whether it is behind.
    private func run(_ relay: Relay, source: any ChangeSource) async throws {
        guard let health else { return try await relay.run() }
        let name = feed.name
        health.set(name, .starting)
        let started = NIOLockedValueBox(false)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await relay.run {
                    started.withLockedValue { $0 = true }
                    health.set(name, .relaying)
                }
            }
            group.addTask { [healthInterval] in
                while true {
                    try await Task.sleep(for: healthInterval)
                    guard started.withLockedValue({ $0 }) else { continue }
                    let behind = await source.isBehind()
                    health.set(name, behind ? .behind(await source.lag()) : .relaying)
                }
            }
            defer { group.cancelAll() }
            try await group.next()
        }
    }

    /// Runs every feed side by side until cancelled.
    public static func runAll(_ runners: [FeedRunner]) async {
        await withDiscardingTaskGroup { group in
            for runner in runners { group.addTask { await runner.run() } }
        }
    }
}
