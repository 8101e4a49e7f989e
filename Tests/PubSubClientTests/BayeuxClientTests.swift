import Bayeux
import NIOCore
import NIOPosix
import PubSubCore
import PubSubServer
import PubSubTesting
import Synchronization
import Testing

@testable import PubSubClient

/// The client against a live broker on a free port.
@Suite(.serialized, .timeLimit(.minutes(1))) struct BayeuxClientTests {
    static let secret = "secret"

    func withServer(
        secret: String? = nil, timeout: TimeAmount = .seconds(45),
        _ body: (PubSubServer, String) async throws -> Void
    ) async throws {
        var extensions: [any BayeuxExtension] = []
        if let secret { extensions.append(PrivatePubAuth(secret: secret)) }
        let server = PubSubServer(
            configuration: ServerConfiguration(
                host: "127.0.0.1", port: 0, broker: BrokerConfiguration(timeout: timeout),
                extensions: ExtensionPipeline(extensions), threads: 1))
        let port = try await server.start()
        do {
            try await body(server, "http://127.0.0.1:\(port)/faye")
        } catch {
            try await server.shutdown()
            throw error
        }
        try await server.shutdown()
    }

    static func signer(_ channel: String, _ clientId: String) -> JSONObject? {
        let ts = String(PrivatePubAuth.wallClockMilliseconds())
        return [
            "private_pub_signature": .string(PrivatePubAuth.signature(secret: secret, channel: channel, timestamp: ts)),
            "private_pub_timestamp": .number(ts),
        ]
    }

    /// The next `n` events, or fewer if they do not come within `seconds`.
    func next(_ n: Int, from client: BayeuxClient, within seconds: Double = 5) async throws -> [Message] {
        try await withThrowingTaskGroup(of: [Message].self) { group in
            group.addTask {
                var got: [Message] = []
                for try await m in client.events {
                    got.append(m)
                    if got.count == n { break }
                }
                return got
            }
            group.addTask {
                try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
                return []
            }
            let first = try await group.next()!
            group.cancelAll()
            return first
        }
    }

    @Test(arguments: [BayeuxClient.Configuration.Transport.longPolling, .webSocket])
    func subscribePublishAndReceive(transport: BayeuxClient.Configuration.Transport) async throws {
        try await withServer(secret: Self.secret) { _, url in
            let subscriber = try BayeuxClient(
                url: url, configuration: .init(transport: transport, subscriptionExt: Self.signer))
            try await subscriber.subscribe("/room/*")
            let publisher = try BayeuxClient(url: url)
            try await publisher.publish("/room/a", data: .object(["n": 1]), ext: ["private_pub_token": "secret"])
            try await publisher.publish("/room/b", data: "two", ext: ["private_pub_token": "secret"])
            let events = try await next(2, from: subscriber)
            #expect(events.map(\.channel) == ["/room/a", "/room/b"])
            #expect(events.map(\.data) == [.object(["n": 1]), .string("two")])
            #expect(events.allSatisfy { $0.ext?["private_pub_token"] == .null })
            await subscriber.disconnect()
            await publisher.close()
        }
    }

    @Test func refusalsCarryTheServersError() async throws {
        try await withServer(secret: Self.secret) { _, url in
            let client = try BayeuxClient(url: url)
            await #expect(throws: BayeuxClientError(.refused, "Incorrect token.")) {
                try await client.publish("/a", data: 1, ext: ["private_pub_token": "wrong"])
            }
            await #expect(throws: BayeuxClientError(.refused, "Incorrect signature.")) {
                try await client.subscribe("/a")
            }
            await client.disconnect()
        }
    }

    @Test func bulkPublishKeepsOrderAndReportsEachMessage() async throws {
        try await withServer { _, url in
            let subscriber = try BayeuxClient(url: url)
            try await subscriber.subscribe("/bulk")
            let publisher = try BayeuxClient(url: url, configuration: .init(batchSize: 7, pipelineDepth: 4))
            var publications = (0..<300).map { BayeuxClient.Publication(channel: "/bulk", data: JSONValue($0)) }
            publications[150].data = .null  // refused by the broker: data is required
            let results = try await publisher.publish(publications)
            #expect(results.count == 300)
            #expect(results.filter { !$0.successful }.count == 1)
            #expect(results[150] == .init(successful: false, error: "402:data:Missing required parameter"))
            let events = try await next(299, from: subscriber, within: 10)
            #expect(events.map(\.data) == (0..<300).filter { $0 != 150 }.map { JSONValue($0) })
            await subscriber.disconnect()
            await publisher.close()
        }
    }

    @Test(arguments: [BayeuxClient.Configuration.Transport.longPolling, .webSocket])
    func rehandshakesAndResubscribesWhenTheServerForgetsTheSession(
        transport: BayeuxClient.Configuration.Transport
    ) async throws {
        try await withServer(secret: Self.secret, timeout: .seconds(1)) { server, url in
            let subscriber = try BayeuxClient(
                url: url, configuration: .init(transport: transport, subscriptionExt: Self.signer))
            try await subscriber.subscribe("/again")
            let first = try #require(await subscriber.clientId)
            let loop = MultiThreadedEventLoopGroup.singleton.next()
            let existed = try await server.broker.engine.destroyClient(first, reason: .disconnected, on: loop).get()
            #expect(existed)
            // The next connect is refused with advice to handshake; the client does, and signs afresh.
            var second: String?
            #expect(
                try await waitUntil {
                    if let id = await subscriber.clientId, id != first { second = id }
                    return second != nil
                })
            // Subscribed again under the new id before anything is published.
            let queries = try #require(server.broker.engine as? any EngineQueries)
            #expect(
                try await waitUntil {
                    try await queries.presence(of: "/again", now: .now(), on: loop).get().contains {
                        $0.clientId == second
                    }
                })
            let publisher = try BayeuxClient(url: url)
            try await publisher.publish("/again", data: "after", ext: ["private_pub_token": "secret"])
            let events = try await next(1, from: subscriber)
            #expect(events.map(\.data) == [.string("after")])
            await subscriber.disconnect()
            await publisher.close()
        }
    }

    @Test(arguments: [BayeuxClient.Configuration.Transport.longPolling, .webSocket])
    func resumesAfterTheServerForgetsTheSession(transport: BayeuxClient.Configuration.Transport) async throws {
        try await withServer(timeout: .seconds(1)) { server, url in
            let outcomes = Mutex<[BayeuxClient.ResumeOutcome]>([])
            var configuration = BayeuxClient.Configuration(transport: transport)
            configuration.resume = true
            configuration.onResumed = { _, outcome in outcomes.withLock { $0.append(outcome) } }
            let subscriber = try BayeuxClient(url: url, configuration: configuration)
            // A first subscribe resumes from the handshake's position.
            let first = try await subscriber.subscribe("/resume")
            #expect(first == BayeuxClient.ResumeOutcome(recovered: true, missed: 0))
            let publisher = try BayeuxClient(url: url)
            try await publisher.publish("/resume", data: 1)
            #expect(try await next(1, from: subscriber).map(\.data) == [1])
            let old = try #require(await subscriber.clientId)
            let loop = MultiThreadedEventLoopGroup.singleton.next()
            _ = try await server.broker.engine.destroyClient(old, reason: .disconnected, on: loop).get()
            try await publisher.publish("/resume", data: 2)
            try await publisher.publish("/resume", data: 3)
            // Whether 2 and 3 came before or after the new session: each exactly once, in order.
            #expect(try await next(2, from: subscriber).map(\.data) == [2, 3])
            #expect(try await next(1, from: subscriber, within: 0.5).isEmpty)
            #expect(await subscriber.clientId != old)
            #expect(outcomes.withLock { $0.map(\.recovered) } == [true])
            #expect(subscriber.receivedPositions[channel: "/resume"] != nil)
            // A position this broker never gave cannot be resumed from.
            let stranger = try BayeuxClient(url: url, configuration: configuration)
            #expect(try await stranger.subscribe("/resume", resumeFrom: "2.nope.nope")?.recovered == false)
            await stranger.disconnect()
            await subscriber.disconnect()
            await publisher.close()
        }
    }

    /// After `recovered: false` on a reconnect a subscription goes on from the broker's position at that moment,
    /// which a handshake of a session ended at once tells: resuming from it misses only what came after.
    @Test(arguments: [BayeuxClient.Configuration.Transport.longPolling, .webSocket])
    func thePositionNowIsTheBrokersCurrentOne(transport: BayeuxClient.Configuration.Transport) async throws {
        try await withServer { server, url in
            var configuration = BayeuxClient.Configuration(transport: transport)
            configuration.resume = true
            let client = try BayeuxClient(url: url, configuration: configuration)
            let publisher = try BayeuxClient(url: url)
            try await publisher.publish("/now", data: 1)
            let now = try #require(await client.positionNow())
            try await publisher.publish("/now", data: 2)
            #expect(try await client.subscribe("/now", resumeFrom: now) == .init(recovered: true, missed: 1))
            #expect(try await next(1, from: client).map(\.data) == [2])
            // The session made for the position is gone already.
            #expect(server.broker.engine.statistics.clients == 1)
            await client.disconnect()
            await publisher.close()
        }
    }

    @Test func unreachableFailsFast() async throws {
        let client = try BayeuxClient(url: "http://127.0.0.1:1/faye")
        let start = ContinuousClock.now
        await #expect(throws: BayeuxClientError.self) { try await client.publish("/a", data: 1) }
        do {
            try await client.handshake()
        } catch let error as BayeuxClientError {
            #expect(error.code == .unreachable)
            #expect(error.message == "cannot connect to 127.0.0.1:1: connection refused")
        }
        #expect(ContinuousClock.now - start < .seconds(3))
        await client.close()
    }
}
