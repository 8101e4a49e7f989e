import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import PubSubTesting
import Testing

@testable import PubSubRedis

/// The client against a real redis-server: AUTH and SELECT from the URL, pipelining, pub/sub, reconnect.
@Suite(.serialized, .timeLimit(.minutes(1))) struct RedisClientTests {
    func connected(_ url: String, onPush: (@Sendable (RESPValue) -> Void)? = nil) async throws -> RedisClient {
        let client = RedisClient(
            configuration: try RedisConfiguration(url: url), eventLoop: MultiThreadedEventLoopGroup.singleton.next(),
            onPush: onPush)
        client.start()
        _ = try await waitUntil(timeout: .seconds(3)) { client.isConnected }
        return client
    }

    @Test func authSelectPipeliningAndReconnect() async throws {
        let server = try await RedisServer.start(arguments: ["--requirepass", "s3cret"])
        defer { server.stop() }
        let client = try await connected("redis://:s3cret@127.0.0.1:\(server.port)/3")
        #expect(client.isConnected)
        let replies = try await client.send((1...100).map { _ in RESPCommand("INCR", "n") } + [RESPCommand("GET", "n")])
            .get()
        #expect(replies.prefix(100).map { $0.int } == (1...100).map { Int64($0) })
        #expect(replies.last?.string == "100")
        let other = try await connected("redis://:s3cret@127.0.0.1:\(server.port)/0")
        #expect(try await other.send(RESPCommand("GET", "n")).get().isNull)  // database 0 is another one
        await #expect(throws: RedisError.self) { try await other.send(RESPCommand("NOSUCHCOMMAND")).get() }
        // A dropped connection comes back by itself.
        client.dropConnection()
        _ = try await waitUntil(timeout: .milliseconds(300), interval: .milliseconds(1)) { !client.isConnected }
        _ = try await waitUntil(timeout: .seconds(3)) { client.isConnected }
        #expect(try await client.send(RESPCommand("GET", "n")).get().string == "100")
        try await client.close().get()
        try await other.close().get()
        // A wrong password never connects (and never hangs).
        let wrong = try await connected("redis://:nope@127.0.0.1:\(server.port)/0")
        #expect(!wrong.isConnected)
        await #expect(throws: RedisError.self) { try await wrong.send(RESPCommand("PING")).get() }
        try await wrong.close().get()
    }

    @Test func pubSubPushesArriveInOrder() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        let received = NIOLockedValueBox<[String]>([])
        let subscriber = try await connected("redis://127.0.0.1:\(server.port)") { push in
            if push.array?.first?.string == "message", let payload = push.array?[2].string {
                received.withLockedValue { $0.append(payload) }
            }
        }
        subscriber.sendWithoutReply([RESPCommand("SUBSCRIBE", "ch")])
        let publisher = try await connected("redis://127.0.0.1:\(server.port)")
        // Subscribed once a publish reaches one subscriber.
        _ = try await waitUntil(timeout: .seconds(1), interval: .milliseconds(5)) {
            try await publisher.send(RESPCommand("PUBLISH", "ch", "0")).get().int == 1
        }
        _ = try await publisher.send((1...50).map { RESPCommand("PUBLISH", "ch", .string("\($0)")) }).get()
        _ = try await waitUntil(timeout: .seconds(3)) { received.withLockedValue { $0.count } >= 51 }
        #expect(received.withLockedValue { Array($0.drop { $0 == "0" }) } == (1...50).map(String.init))
        #expect(try await subscriber.send(RESPCommand("PING")).get().array?.first?.string == "pong")
        try await subscriber.close().get()
        try await publisher.close().get()
    }

    @Test func aSlowReplyTimesOutClosesAndReconnects() async throws {
        let server = try await RedisServer.start(arguments: ["--enable-debug-command", "yes"])
        defer { server.stop() }
        var configuration = try RedisConfiguration(url: "redis://127.0.0.1:\(server.port)")
        configuration.commandTimeout = .milliseconds(300)
        let client = RedisClient(configuration: configuration, eventLoop: MultiThreadedEventLoopGroup.singleton.next())
        client.start()
        _ = try await waitUntil(timeout: .seconds(3)) { client.isConnected }
        let started = NIODeadline.now()
        do {
            _ = try await client.send(RESPCommand("DEBUG", "SLEEP", "2")).get()
            Issue.record("no timeout")
        } catch let error as RedisError {
            #expect(error.code == .timeout)
        }
        #expect(NIODeadline.now() - started < .seconds(1))
        // The server sleeps 2 s in all: the client keeps reconnecting until it answers again.
        var pong: String?
        _ = try await waitUntil(timeout: .seconds(5), interval: .milliseconds(50)) {
            pong = try? await client.send(RESPCommand("PING")).get().string
            return pong != nil
        }
        #expect(pong == "PONG")
        try await client.close().get()
    }

    /// A write refused with READONLY (the server is a replica now) drops the connection and says so; a connection
    /// whose check fails (here: ROLE is not master) is never used, and the next attempt is resolved again.
    @Test func readOnlyDropsTheConnectionAndAFailedCheckIsNeverUsed() async throws {
        let master = try await RedisServer.start()
        defer { master.stop() }
        let replica = try await RedisServer.start(arguments: ["--replicaof", "127.0.0.1", String(master.port)])
        defer { replica.stop() }
        let readOnly = NIOLockedValueBox(0)
        let client = RedisClient(
            configuration: try RedisConfiguration(url: replica.url),
            eventLoop: MultiThreadedEventLoopGroup.singleton.next(),
            onRedirect: { message in if message.hasPrefix("READONLY") { readOnly.withLockedValue { $0 += 1 } } })
        client.start()
        _ = try await waitUntil(timeout: .seconds(3)) { client.isConnected }
        let reply = try await client.send([RESPCommand("SET", "k", "v")]).get()
        #expect(RedisClient.redirect(reply[0])?.hasPrefix("READONLY") == true)
        #expect(readOnly.withLockedValue { $0 } == 1)
        _ = try await waitUntil(timeout: .seconds(1)) { !client.isConnected }
        try await client.close().get()

        // Resolved at each attempt: the replica first (refused by the check), then the master.
        let attempts = NIOLockedValueBox<[Int]>([])
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let checked = RedisClient(
            configuration: RedisConfiguration(backoff: (.milliseconds(10), .milliseconds(20))), eventLoop: loop,
            resolve: {
                let port = attempts.withLockedValue { a -> Int in
                    a.append(a.isEmpty ? replica.port : master.port)
                    return a.last!
                }
                return loop.makeSucceededFuture(RedisEndpoint(host: "127.0.0.1", port: port))
            },
            verify: { endpoint, send in
                send([RESPCommand("ROLE")]).flatMapThrowing { replies in
                    guard SentinelStateMachine.parseRole(replies[0]) == "master" else { throw RedisError(.notMaster) }
                }
            })
        checked.start()
        _ = try await waitUntil(timeout: .seconds(3)) { checked.isConnected }
        #expect(checked.endpoint?.port == master.port)
        #expect(attempts.withLockedValue { $0 } == [replica.port, master.port])
        #expect(try await checked.send(RESPCommand("SET", "k", "v")).get().string == "OK")
        try await checked.close().get()
    }
}
