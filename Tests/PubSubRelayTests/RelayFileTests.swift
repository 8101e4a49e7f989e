import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Testing

@testable import PubSubRelay

@Suite struct RelayFileTests {
    func parse(_ text: String) throws -> RelayFile {
        try RelayFile(json: try JSONParser().parse(Array(text.utf8)), logger: Logger(label: "test"))
    }

    @Test func readsFeedsWithDefaultsAndTheirOwnSettings() throws {
        let file = try parse(
            """
            {"url": "http://broker/faye", "feeds": [
              {"source": "postgres", "dsn": "postgres://u@h/db", "slot": "s1", "table": "public.a",
               "checkpoint": "/var/lib/a"},
              {"name": "b", "source": "postgres", "dsn": "postgres://u@h/db", "slot": "s2",
               "table": ["public.b", "x.y"], "checkpoint": "/var/lib/b", "prefix": "/feeds", "include_doc": true,
               "batch_size": 7, "poll_interval": 0.5, "max_changes": 10}
            ]}
            """)
        #expect(file.url == "http://broker/faye" && file.secret == nil)
        #expect(file.feeds.map(\.name) == ["feed0", "b"])
        #expect(file.feeds[0].mapping.prefix == "/changes" && !file.feeds[0].mapping.includeDocument)
        #expect(file.feeds[0].batchSize == 100)
        #expect(
            try PostgresChangeSource.Configuration(settings: file.feeds[0].settings).pollInterval == .milliseconds(100))
        #expect(file.feeds[1].mapping.prefix == "/feeds" && file.feeds[1].mapping.includeDocument)
        #expect(file.feeds[1].batchSize == 7)
        #expect(
            try PostgresChangeSource.Configuration(settings: file.feeds[1].settings).pollInterval == .milliseconds(500))
        let source = try file.feeds[1].makeSource(logger: Logger(label: "test"))
        #expect(source.sourceID == "pg:s2")
    }

    @Test func namesTheBadSetting() {
        let cases: [(String, String)] = [
            (
                #"{"feeds": [{"source": "postgres", "checkpoint": "c", "dsn": "mysql://h", "slot": "s", "table": "a.b"}]}"#,
                "feeds[0].dsn:"
            ),
            (
                #"{"feeds": [{"source": "postgres", "checkpoint": "c", "dsn": "postgres://h/d", "slot": "s", "table": "a.b", "batch_size": 0}]}"#,
                "feeds[0].batch_size: must be positive"
            ),
            (
                #"{"feeds": [{"source": "postgres", "checkpoint": "c", "dsn": "postgres://h/d", "slot": "s", "table": "a.b", "prefix": "/meta/x"}]}"#,
                "feeds[0].prefix:"
            ),
            (
                #"{"feeds": [{"name": "x", "source": "postgres", "checkpoint": "c", "dsn": "postgres://h/d", "slot": "s", "table": "a.b"}, {"name": "x", "source": "postgres", "checkpoint": "d", "dsn": "postgres://h/d", "slot": "t", "table": "a.b"}]}"#,
                "feeds[1].name: x names two feeds"
            ),
            (
                #"{"feeds": [{"source": "postgres", "checkpoint": "c", "dsn": "postgres://h/d", "slot": "s", "table": 3}]}"#,
                "feeds[0].table: expected a string or an array of strings"
            ),
            (#"{"feed": []}"#, "relay.feed: unknown setting"),
            (#"[1]"#, "expected a JSON object"),
        ]
        for (text, expected) in cases {
            do {
                _ = try parse(text)
                Issue.record("accepted \(text)")
            } catch let error as RelayError where error.code == .configuration {
                #expect(error.message.contains(expected), "\(error.message) for \(text)")
            } catch {
                Issue.record("unexpected \(error)")
            }
        }
    }

    @Test func messagePublisherSendsTheTokenInBatchesAndFailsOnARefusal() async throws {
        let sent = NIOLockedValueBox<[[Message]]>([])
        let refuse = NIOLockedValueBox<String?>(nil)
        let publisher = MessagePublisher(token: "s3cret", batchSize: 2) { messages in
            sent.withLockedValue { $0.append(messages) }
            return messages.map { message in
                var reply = message.makeResponse()
                if message.channel == refuse.withLockedValue({ $0 }) { reply.fail("403::Forbidden") }
                return reply
            }
        }
        let messages = (1...5).map {
            RelayMessage(channel: "/c/\($0)", data: .object(["n": JSONValue($0)]), key: "k\($0)")
        }
        try await publisher.publish(messages)
        let batches = sent.withLockedValue { $0 }
        #expect(batches.map(\.count) == [2, 2, 1])
        #expect(batches.flatMap { $0 }.map(\.channel) == messages.map(\.channel))
        #expect(batches[0][0].ext?["private_pub_token"] == "s3cret")

        refuse.withLockedValue { $0 = "/c/4" }
        await expectRelayError(.publish) { try await publisher.publish(messages) }
    }
}
