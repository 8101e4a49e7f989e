import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import RelayFakes
import Testing

@testable import PubSubRelay

@Suite struct SimperiumMessageTests {
    @Test func decodesEveryServerMessage() throws {
        #expect(
            try SimperiumMessage.decode("0:auth:user@example.com").message == .authenticated(user: "user@example.com"))
        #expect(
            try SimperiumMessage.decode("0:auth:expired").message
                == .authenticationFailed(reason: "the token has expired"))
        #expect(
            try SimperiumMessage.decode(#"0:auth:{"msg":"Token invalid","code":401}"#).message
                == .authenticationFailed(reason: "Token invalid (401)"))
        #expect(try SimperiumMessage.decode("h:7") == (nil, .heartbeat(7)))
        #expect(try SimperiumMessage.decode("0:cv:?").message == .unknownVersion)
        #expect(try SimperiumMessage.decode("0:c:?").message == .unknownVersion)
        #expect(try SimperiumMessage.decode("3:c:[]") == (3, .changes([])))
        let page = try SimperiumMessage.decode(
            #"0:i:{"current":"abc1","index":[{"id":"n:1","v":3},{"id":"n2","v":1}],"mark":"6e33"}"#
        ).message
        #expect(
            page
                == .index(
                    SimperiumIndexPage(
                        current: "abc1", entries: [.init(id: "n:1", version: 3), .init(id: "n2", version: 1)],
                        mark: "6e33")))
        let last = try SimperiumMessage.decode(#"0:i:{"current":"abc1","index":[]}"#).message
        #expect(last == .index(SimperiumIndexPage(current: "abc1", entries: [], mark: nil)))
        #expect(try SimperiumMessage.decode("0:e:n1.2\n?").message == .entity(key: "n1.2", data: nil))
        #expect(
            try SimperiumMessage.decode("0:e:n1.2\n{\"data\":{}}").message
                == .entity(key: "n1.2", data: .object(["data": .object([:])])))
    }

    @Test func mapsChangeOperations() throws {
        let text =
            #"0:c:[{"clientid":"w","cv":"cv1","ev":1,"id":"a","o":"M","v":{},"ccids":["x"]},"#
            + #"{"clientid":"w","cv":"cv2","ev":2,"sv":1,"id":"a","o":"M","v":{}},"#
            + #"{"cv":"cv3","ev":3,"sv":2,"id":"a","o":"-"},{"id":"a","error":409,"ccids":["y"]}]"#
        guard case .changes(let changes) = try SimperiumMessage.decode(text).message else {
            Issue.record("not changes")
            return
        }
        #expect(changes.map(\.changeOperation) == [.insert, .update, .delete, .insert])
        #expect(changes.map(\.cv) == ["cv1", "cv2", "cv3", ""])
        #expect(changes[0].endVersion == 1 && changes[1].sourceVersion == 1)
        #expect(changes[3].error == 409)
        // sv 0 is a new entity too.
        let zero = try SimperiumMessage.decode(#"0:c:[{"cv":"c","ev":1,"sv":0,"id":"b","o":"M"}]"#).message
        #expect(zero == .changes([SimperiumChange(id: "b", cv: "c", endVersion: 1, sourceVersion: 0, operation: "M")]))
        #expect(
            SimperiumChange(id: "b", cv: "c", endVersion: 1, sourceVersion: 0, operation: "M").changeOperation
                == .insert)
    }

    @Test func refusesMalformedInput() {
        for text in [
            "", "nocolon", "0:", "0:c:[{", "0:c:{}", #"0:c:[{"cv":"x","o":"M"}]"#,
            #"0:c:[{"id":"a","cv":"x","o":"Z"}]"#, #"0:c:[{"id":"a","cv":"x","o":"M","ev":"two"}]"#,
            "0:i:{\"index\":[]}", #"0:i:{"current":"c","index":[{"id":"a"}]}"#, "0:i:[", "h:x",
            "0:cv:abc", "0:zz:1", "0:e:n1.2", "0:auth:", "0:auth:{broken",
        ] {
            expectRelayError(.simperiumProtocol, "\(text)") { try SimperiumMessage.decode(text) }
        }
    }

    @Test func encodesClientMessages() throws {
        #expect(SimperiumMessage.index(mark: nil, limit: 50) == "0:i::::50")
        #expect(SimperiumMessage.index(mark: "6e31", limit: 50) == "0:i::6e31::50")
        #expect(SimperiumMessage.changesSince(cv: "5f00a") == "0:cv:5f00a")
        #expect(SimperiumMessage.heartbeat(4) == "h:4")
        #expect(SimperiumMessage.entity(id: "n1", version: 3) == "0:e:n1.3")
        let text = SimperiumMessage.initialize(clientID: "c1", token: "t", appID: "app", bucket: "notes")
        #expect(text.hasPrefix("0:init:{"))
        let object = try JSONParser().parse(Array(text.dropFirst("0:init:".count).utf8)).objectValue
        #expect(object?["api"] == .number("1"))
        #expect(object?["clientid"] == "c1" && object?["token"] == "t" && object?["app_id"] == "app")
        #expect(object?["name"] == "notes" && object?["library"] != nil && object?["version"] != nil)
    }

    @Test func feedSettingsBuildTheSource() throws {
        let logger = Logger(label: "test")
        var object: JSONObject = [
            "source": "simperium", "checkpoint": "/tmp/c", "app_id": "a1", "token": "t", "bucket": "notes",
            "simperium_url": "ws://127.0.0.1:9", "heartbeat": 5, "index_page": 50, "include_doc": true,
        ]
        let source = try FeedKind.simperium.makeSource(FeedSettings(object, context: "feeds[0]"), logger: logger)
        #expect(source.sourceID == "simperium:a1/notes")
        let configuration = try #require(source as? SimperiumChangeSource).configuration
        #expect(configuration.url == "ws://127.0.0.1:9/sock/1/a1/websocket")
        #expect(configuration.indexPageSize == 50 && configuration.heartbeatInterval == .seconds(5))
        #expect(configuration.includeDocuments && configuration.token == "t")
        for (key, value, problem) in [
            ("bogus", JSONValue.bool(true), "feeds[0].bogus: unknown setting"),
            ("bucket", "a/b", "feeds[0].app_id: bucket a/b"),
            ("index_page", 0, "feeds[0].index_page"),
            ("heartbeat", "x", "feeds[0].heartbeat: expected a number"),
            ("simperium_url", "http://h/x", "feeds[0].simperium_url"),
        ] {
            var bad = object
            bad[key] = value
            #expect {
                _ = try FeedKind.simperium.makeSource(FeedSettings(bad, context: "feeds[0]"), logger: logger)
            } throws: { error in
                (error as? RelayError)?.message.hasPrefix(problem) == true
            }
        }
        if SimperiumChangeSource.Configuration.environmentToken() == nil {
            object["token"] = nil
            expectRelayError(.configuration) {
                _ = try FeedKind.simperium.makeSource(FeedSettings(object, context: "feeds[0]"), logger: logger)
            }
        }
    }

    @Test func buildsTheWebSocketURL() {
        typealias C = SimperiumChangeSource.Configuration
        #expect(C.websocketURL(base: nil, appID: "a1") == "wss://api.simperium.com/sock/1/a1/websocket")
        #expect(C.websocketURL(base: "ws://127.0.0.1:5/", appID: "a1") == "ws://127.0.0.1:5/sock/1/a1/websocket")
        #expect(C.websocketURL(base: "ws://h/x/y", appID: "a1") == "ws://h/x/y")
    }
}

/// A fake server, a source on it and a relay with a file checkpoint and the fake publisher.
struct SimperiumHarness {
    let fake: SimperiumFake
    let port: Int
    let directory: String
    let journal = Journal()
    let publisher: FakePublisher

    static func start(_ options: SimperiumFake.Options = .init()) async throws -> SimperiumHarness {
        let fake = SimperiumFake(options: options)
        var logger = Logger(label: "test.simperium.fake")
        logger.logLevel = .critical
        let port = try await fake.start(logger: logger)
        let journal = Journal()
        return SimperiumHarness(
            fake: fake, port: port, directory: temporaryDirectory(),
            publisher: FakePublisher(journal: journal))
    }

    func source(
        token: String = "secret-token", heartbeat: TimeAmount = .seconds(20),
        heartbeatTimeout: TimeAmount = .seconds(10), indexPage: Int = 100,
        includeDocuments: Bool = false
    ) -> SimperiumChangeSource {
        var logger = Logger(label: "test.simperium")
        logger.logLevel = .critical
        return SimperiumChangeSource(
            configuration: .init(
                url: "ws://127.0.0.1:\(port)/sock/1/test-app/websocket", appID: "test-app",
                token: token, bucket: "notes", indexPageSize: indexPage, batchSize: 10,
                includeDocuments: includeDocuments,
                heartbeatInterval: heartbeat, heartbeatTimeout: heartbeatTimeout,
                reconnectDelay: .milliseconds(20)),
            logger: logger)
    }

    var store: FileCheckpointStore { FileCheckpointStore(path: directory + "/checkpoint") }

    /// Runs a relay on `source` until `body` returns.
    func withRelay<T>(_ source: SimperiumChangeSource, _ body: () async throws -> T) async throws -> T {
        var logger = Logger(label: "test.relay")
        logger.logLevel = .critical
        let relay = Relay(source: source, publisher: publisher, store: store, logger: logger)
        let task = Task { try await relay.run() }
        defer { task.cancel() }
        do {
            let result = try await body()
            task.cancel()
            _ = await task.result
            await source.close()
            return result
        } catch {
            task.cancel()
            _ = await task.result
            await source.close()
            throw error
        }
    }

    var messages: [JSONObject] { publisher.published.withLockedValue { $0 }.map { $0.data.objectValue! } }
    var ids: Set<String> { Set(messages.compactMap { $0["id"]?.stringValue }) }

    func stop() async {
        await fake.stop()
        removeDirectory(directory)
    }
}

/// Waits until `condition` holds, failing after `seconds`.
func eventually(_ what: String, seconds: Double = 10, _ condition: () async throws -> Bool) async throws {
    let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
    while ContinuousClock.now < deadline {
        if try await condition() { return }
        try await Task.sleep(nanoseconds: 20_000_000)
    }
    Issue.record("timed out waiting for \(what)")
    throw Injected()
}

@Suite(.serialized, .timeLimit(.minutes(1))) struct SimperiumSourceTests {
    @Test func firstSyncPagesThroughTheIndexThenRelaysLiveChanges() async throws {
        let h = try await SimperiumHarness.start()
        defer { Task { await h.stop() } }
        for index in 0..<7 { h.fake.put(bucket: "notes", id: "n\(index)", data: ["text": .string("t\(index)")]) }
        h.fake.put(bucket: "notes", id: "n1", data: ["text": "changed"])
        h.fake.delete(bucket: "notes", id: "n6")
        let head = h.fake.head(bucket: "notes")
        try await h.withRelay(h.source(indexPage: 3)) {
            try await eventually("the index") { h.messages.count >= 6 }
            try await eventually("the index checkpoint") { try h.store.load()?.position == head }
            let indexed = h.messages
            #expect(indexed.count == 6)
            #expect(Set(indexed.compactMap { $0["id"]?.stringValue }) == ["n0", "n1", "n2", "n3", "n4", "n5"])
            #expect(indexed.allSatisfy { $0["op"] == "update" && $0["resync"] == .bool(true) })
            #expect(indexed.first { $0["id"] == "n1" }?["rev"] == .number("2"))
            #expect(h.fake.statistics.indexRequests == 2, "6 entities in pages of 3")
            #expect(try h.store.load()?.sourceID == "simperium:test-app/notes")

            h.fake.put(bucket: "notes", id: "n9", data: ["text": "new"])
            h.fake.put(bucket: "notes", id: "n2", data: ["text": "edited"])
            h.fake.delete(bucket: "notes", id: "n3")
            let after = h.fake.head(bucket: "notes")
            try await eventually("3 live changes") { h.messages.count >= 9 }
            let live = Array(h.messages.dropFirst(6))
            #expect(live.map { $0["id"]?.stringValue ?? "" } == ["n9", "n2", "n3"])
            #expect(live.map { $0["op"]?.stringValue ?? "" } == ["insert", "update", "delete"])
            #expect(live.allSatisfy { $0["resync"] == nil })
            #expect(live[1]["rev"] == .number("2"))
            #expect(h.publisher.published.withLockedValue { $0 }.last?.channel == "/changes/notes/n3")
            try await eventually("the live checkpoint") { try h.store.load()?.position == after }
            #expect(live[2]["seq"] == .string(after))
        }
    }

    @Test func answeredHeartbeatsKeepTheConnectionUnansweredOnesReconnect() async throws {
        let h = try await SimperiumHarness.start()
        defer { Task { await h.stop() } }
        let source = h.source(heartbeat: .milliseconds(150), heartbeatTimeout: .milliseconds(300))
        try await h.withRelay(source) {
            try await eventually("three answered heartbeats") { h.fake.statistics.heartbeatsAnswered >= 3 }
            #expect(source.connections == 1)
            #expect(h.fake.statistics.connections == 1)

            h.fake.answerHeartbeats = false
            try await eventually("a reconnection after an unanswered heartbeat") { source.connections >= 2 }
            h.fake.answerHeartbeats = true
            h.fake.put(bucket: "notes", id: "after", data: [:])
            try await eventually("a change after the reconnection") { h.ids.contains("after") }
            // It resumed from its checkpoint (cv), it did not index again.
            #expect(h.fake.statistics.indexRequests == 1)
            #expect(h.fake.statistics.versionRequests.count >= 2)
        }
    }

    @Test func aDroppedConnectionResumesFromTheCheckpointWithoutAGap() async throws {
        let h = try await SimperiumHarness.start()
        defer { Task { await h.stop() } }
        let source = h.source()
        try await h.withRelay(source) {
            try await eventually("the first sync") { try h.store.load() != nil }
            for index in 0..<20 { h.fake.put(bucket: "notes", id: "a\(index)", data: [:]) }
            try await eventually("some changes") { h.messages.count >= 5 }
            h.fake.dropConnections()
            for index in 0..<20 { h.fake.put(bucket: "notes", id: "b\(index)", data: [:]) }
            try await eventually("a reconnection") { source.connections >= 2 }
            for index in 0..<20 { h.fake.put(bucket: "notes", id: "c\(index)", data: [:]) }
            let expected = Set((0..<20).flatMap { ["a\($0)", "b\($0)", "c\($0)"] })
            try await eventually("all 60 changes") { h.ids.isSuperset(of: expected) }
            #expect(h.fake.statistics.indexRequests == 1)
            let checkpoints = h.fake.statistics.versionRequests
            #expect(checkpoints.count >= 2)
            // Duplicates, if any, carry the same key.
            var keys: [String: Set<String>] = [:]
            for message in h.messages {
                keys[message["seq"]!.stringValue!, default: []].insert(message["key"]!.stringValue!)
            }
            #expect(keys.values.allSatisfy { $0.count == 1 })
            // A live change is delivered in cv order per document: the last one has the head cv.
            let head = h.fake.head(bucket: "notes")
            try await eventually("the final checkpoint") { try h.store.load()?.position == head }
        }
    }

    /// From the cv of a change, and from the cv of a bucket without changes yet.
    @Test(arguments: [true, false])
    func aRestartResumesFromTheCheckpointedChangeVersion(entityFirst: Bool) async throws {
        let h = try await SimperiumHarness.start()
        defer { Task { await h.stop() } }
        if entityFirst { h.fake.put(bucket: "notes", id: "first", data: [:]) } else { _ = h.fake.head(bucket: "notes") }
        try await h.withRelay(h.source()) {
            try await eventually("the first sync") { try h.store.load()?.position == h.fake.head(bucket: "notes") }
        }
        let checkpoint = try #require(try h.store.load()).position
        for index in 0..<5 { h.fake.put(bucket: "notes", id: "later\(index)", data: [:]) }
        let before = h.messages.count
        try await h.withRelay(h.source()) {
            try await eventually("the changes made while stopped") { h.messages.count >= before + 5 }
        }
        #expect(h.fake.statistics.versionRequests.contains(checkpoint))
        #expect(h.fake.statistics.indexRequests == 1)
        #expect(h.messages.dropFirst(before).map { $0["id"]?.stringValue ?? "" } == (0..<5).map { "later\($0)" })
    }

    @Test(arguments: ["cv:?", "c:?"])
    func anUnknownChangeVersionResyncsFromTheFullIndex(reply: String) async throws {
        let h = try await SimperiumHarness.start(.init(unknownVersionReply: reply))
        defer { Task { await h.stop() } }
        h.fake.put(bucket: "notes", id: "x", data: [:])
        try await h.withRelay(h.source()) {
            try await eventually("the first sync") { try h.store.load()?.position == h.fake.head(bucket: "notes") }
        }
        h.fake.put(bucket: "notes", id: "y", data: [:])
        h.fake.forgetChangeLog(bucket: "notes")
        let head = h.fake.head(bucket: "notes")
        let source = h.source()
        try await source.start(after: try h.store.load()?.position)
        var batches: [ChangeBatch] = []
        try await eventually("the resync") {
            if let batch = try await source.next() {
                batches.append(batch)
                try await source.confirm(batch.position)
            }
            return batches.last?.position == head
        }
        await source.close()
        #expect(h.fake.statistics.unknownVersionReplies == 1)
        #expect(batches.first?.resync?.reason.contains("cv:?") == true)
        #expect(batches.dropFirst().allSatisfy { $0.resync == nil })
        let changes = batches.flatMap(\.changes)
        #expect(Set(changes.compactMap(\.id)) == ["x", "y"])
        #expect(changes.allSatisfy { $0.operation == .update && $0.extra["resync"] == .bool(true) })

        // Through the relay, the resync moves the checkpoint to the index's current.
        try await h.withRelay(h.source()) {
            try await eventually("the checkpoint after the resync") { try h.store.load()?.position == head }
        }
    }

    @Test func aRefusedOrExpiredTokenIsAClearFatalError() async throws {
        let h = try await SimperiumHarness.start(.init(expiredTokens: ["old-token"]))
        defer { Task { await h.stop() } }
        for (token, expected) in [("wrong", "Token invalid (401)"), ("old-token", "expired")] {
            let source = h.source(token: token)
            do {
                try await source.start(after: nil)
                Issue.record("\(token) was accepted")
            } catch let error as RelayError {
                #expect(error.code == .sourceFatal && error.isFatal)
                #expect(
                    error.message.contains("authentication refused") && error.message.contains(expected), "\(error)")
            }
            await source.close()
        }
        // Nothing listening: a clear error, not a hang.
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let nowhere = SimperiumChangeSource(
            configuration: .init(url: "ws://127.0.0.1:1/sock/1/a/websocket", appID: "a", token: "t", bucket: "b"),
            logger: logger)
        await expectRelayError(.sourceFatal) { try await nowhere.start(after: nil) }
        await nowhere.close()
    }

    @Test func includeDocumentsFetchesEachEntityVersion() async throws {
        let h = try await SimperiumHarness.start()
        defer { Task { await h.stop() } }
        for index in 0..<3 { h.fake.put(bucket: "notes", id: "d\(index)", data: ["n": .number(String(index))]) }
        let source = h.source(indexPage: 2, includeDocuments: true)
        try await source.start(after: nil)
        var changes: [Change] = []
        func drain(until count: Int) async throws {
            try await eventually("\(count) changes") {
                if let batch = try await source.next() { changes += batch.changes }
                return changes.count >= count
            }
        }
        try await drain(until: 3)
        #expect(changes.map { $0.document } == (0..<3).map { ["n": .number(String($0))] })
        h.fake.put(bucket: "notes", id: "d1", data: ["n": "one"])
        h.fake.delete(bucket: "notes", id: "d0")
        try await drain(until: 5)
        #expect(changes[3].id == "d1" && changes[3].operation == .update && changes[3].document == ["n": "one"])
        #expect(changes[4].id == "d0" && changes[4].operation == .delete && changes[4].document == nil)
        await source.close()
    }

    @Test func malformedServerInputReconnectsInsteadOfCrashing() async throws {
        let h = try await SimperiumHarness.start()
        defer { Task { await h.stop() } }
        let source = h.source()
        try await h.withRelay(source) {
            try await eventually("the first sync") { try h.store.load() != nil }
            // Sent again until it lands: a reconnection counts as soon as the source dials, before the fake has
            // taken the new connection, and what is sent meanwhile reaches no one.
            try await eventually("a reconnection") {
                if source.connections >= 2 { return true }
                h.fake.sendRaw("0:c:[{\"broken")
                return false
            }
            try await eventually("another reconnection") {
                if source.connections >= 3 { return true }
                h.fake.sendRaw("\u{0}\u{1}garbage")
                return false
            }
            h.fake.put(bucket: "notes", id: "still", data: [:])
            try await eventually("a change afterwards") { h.ids.contains("still") }
        }
    }
}

extension SimperiumSourceTests {
    @Test func aCrashInTheMiddleOfTheFirstIndexIndexesAgain() async throws {
        let h = try await SimperiumHarness.start()
        defer { Task { await h.stop() } }
        for index in 0..<25 { h.fake.put(bucket: "notes", id: "e\(index)", data: [:]) }
        let head = h.fake.head(bucket: "notes")
        let first = h.source(indexPage: 5)
        try await first.start(after: nil)
        var batch: ChangeBatch?
        try await eventually("a first batch") {
            batch = try await first.next()
            return batch != nil
        }
        // Not the whole index yet: the position says "no change version", so a restart indexes again.
        #expect((batch?.changes.count ?? 0) < 25 && batch?.position == "")
        await first.close()

        let second = h.source(indexPage: 5)
        try await second.start(after: batch?.position)
        var ids: Set<String> = []
        var position: String?
        try await eventually("the whole index") {
            if let next = try await second.next() {
                ids.formUnion(next.changes.compactMap(\.id))
                position = next.position
            }
            return position == head
        }
        await second.close()
        #expect(ids == Set((0..<25).map { "e\($0)" }))
        #expect(h.fake.statistics.unknownVersionReplies == 0)
    }
}
