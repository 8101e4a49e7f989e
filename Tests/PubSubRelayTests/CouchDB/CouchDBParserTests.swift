import Bayeux
import Logging
import NIOCore
import Testing

@testable import PubSubRelay

@Suite struct CouchDBParserTests {
    func chunks(_ parts: [String]) -> [ByteBuffer] { parts.map { ByteBuffer(string: $0) } }

    @Test func continuousLinesWithHeartbeatsCRLFSplitRowsAndTheLastSeqLine() throws {
        var parser = ContinuousFeedParser()
        var events: [CouchDBFeedEvent] = []
        for chunk in chunks([
            "\n", "{\"seq\":1,\"id\":\"a\",\"changes\":[{\"rev\":\"1-x\"}]}\r\n\n{\"seq\":\"2-g1AA",
            "AAbc\",\"id\":\"b/c\",\"changes\":[{\"rev\":\"3-y\"}],\"deleted\":true}\n",
            "{\"last_seq\":\"2-g1AAAAbc\",\"pending\":7}\n",
        ]) {
            events += try parser.feed(chunk)
        }
        #expect(
            events == [
                .heartbeat,
                .row(CouchDBRow(seq: "1", id: "a", rev: "1-x")),
                .heartbeat,
                .row(CouchDBRow(seq: "2-g1AAAAbc", id: "b/c", rev: "3-y", deleted: true)),
                .end(lastSeq: "2-g1AAAAbc", pending: 7),
            ])
        #expect(!parser.lines.hasPartialLine)
        _ = try parser.feed(ByteBuffer(string: "{\"seq\":3,"))
        #expect(parser.lines.hasPartialLine)
    }

    @Test func malformedRowsAreErrorsNotCrashes() {
        for bad in ["{\"seq\":1,\"id\":\n", "[1,2]\n", "{\"id\":\"a\"}\n", "{\"seq\":1,\"id\":5}\n", "nonsense\n"] {
            var parser = ContinuousFeedParser()
            expectRelayError(.feed, "\(bad)") { try parser.feed(ByteBuffer(string: bad)) }
        }
    }

    @Test func longpollBodyWithHeartbeatNewlinesInsideTheJSON() throws {
        // CouchDB 3's bytes: `{"results":[\n`, heartbeats while waiting, rows joined by `,\r\n`, then the tail.
        let body =
            "{\"results\":[\n\n\n{\"seq\":\"12::34\",\"id\":\"a\",\"changes\":[{\"rev\":\"2-z\"}]},\r\n"
            + "{\"seq\":35,\"id\":\"b\",\"removed\":[\"ch1\"],\"changes\":[{\"rev\":\"3-q\"}]}"
            + "\n],\n\"last_seq\":35,\"pending\":0}\n"
        let list = try CouchDBFeedParser.list(Array(body.utf8))
        #expect(
            list.rows == [
                CouchDBRow(seq: "12::34", id: "a", rev: "2-z"),
                CouchDBRow(seq: "35", id: "b", rev: "3-q", removed: ["ch1"]),
            ])
        #expect(list.lastSeq == "35" && list.pending == 0)
        // PouchDB Server leaves out `pending`; an empty wait is only heartbeats.
        let empty = try CouchDBFeedParser.list(Array("{\"results\":[\n\n\n\n],\n\"last_seq\":9}\n".utf8))
        #expect(empty.rows.isEmpty && empty.lastSeq == "9" && empty.pending == nil)
        expectRelayError(.feed) { try CouchDBFeedParser.list(Array("{\"results\":[\n".utf8)) }
    }

    @Test func eventSourceDataIdAndHeartbeatEvents() throws {
        var parser = EventSourceFeedParser()
        var events: [CouchDBFeedEvent] = []
        for chunk in chunks([
            "event: heartbeat\ndata: \n\n",
            "data: {\"seq\":\"5-g1\",\"id\":\"x\",\"changes\":[{\"rev\":\"1-a\"}]}\nid: \"5-g",
            "1\"\n\n: a comment\n\r\n", "data: {\"id\":\"y\",\"changes\":[{\"rev\":\"1-b\"}]}\r\nid: 6\r\n\r\n",
        ]) {
            events += try parser.feed(chunk)
        }
        #expect(
            events == [
                .heartbeat,
                .row(CouchDBRow(seq: "5-g1", id: "x", rev: "1-a")),
                .row(CouchDBRow(seq: "6", id: "y", rev: "1-b")),
            ])
    }

    @Test func rowsBecomeChangesWithOpRevAndRemoved() {
        let db = ["db"]
        #expect(CouchDBRow(seq: "1", id: "a", rev: "1-x").change(collection: db).operation == .insert)
        #expect(CouchDBRow(seq: "2", id: "a", rev: "2-x").change(collection: db).operation == .update)
        #expect(CouchDBRow(seq: "2", id: "a", rev: "10-x").change(collection: db).operation == .update)
        let deleted = CouchDBRow(seq: "3", id: "a", rev: "3-x", deleted: true).change(collection: db)
        #expect(deleted.operation == .delete && deleted.extra["rev"] == "3-x")
        let removed = CouchDBRow(seq: "4", id: "a", rev: "4-x", removed: ["ch"]).change(collection: db, resync: true)
        #expect(removed.operation == .delete)
        #expect(removed.extra["removed"] == ["ch"] && removed.extra["resync"] == true)
    }

    @Test func databaseURLs() throws {
        let url = try CouchDBURL("https://us%40r:p%3Ass@couch.example:6984/shop%2Forders")
        #expect(url.tls && url.host == "couch.example" && url.port == 6984)
        #expect(url.user == "us@r" && url.password == "p:ss")
        #expect(url.collection == ["shop/orders"] && url.base == "https://couch.example:6984/shop%2Forders")
        let keyspace = try CouchDBURL("http://[::1]:4984/travel.inventory.hotels/")
        #expect(keyspace.collection == ["travel", "inventory", "hotels"] && keyspace.host == "[::1]")
        #expect(keyspace.feedName == "[::1]:4984/travel.inventory.hotels")
        for bad in [
            "couch.example/db", "http://host:99999/db", "http://host", "http://host/", "http://host/db?x=1",
            "http://host/db/_changes", "ftp://host/db",
        ] {
            expectRelayError(.invalidURL, "\(bad)") { try CouchDBURL(bad) }
        }
        let unclosed = expectRelayError(.invalidURL) { try CouchDBURL("http://u@[::1:5984/db") }
        #expect(unclosed?.message == "--db-url: unclosed [ in the host")
        let port = expectRelayError(.invalidURL) { try CouchDBURL("http://u:p@[::1]:x/db") }
        #expect(port?.message == "--db-url: bad port x")
        #expect(CouchDBURL.queryEncode("12::34") == "12%3A%3A34")
    }
}

@Suite struct CouchDBSettingsTests {
    func settings(_ json: String) throws -> FeedSettings {
        FeedSettings(try #require(try JSONParser().parse(json).objectValue), context: "feeds[0]")
    }

    @Test func configFileFeedReadsTheCLISettingsInSnakeCase() throws {
        let configuration = try CouchDBChangeSource.Configuration(
            settings: try settings(
                """
                {"source":"couchdb","db_url":"http://u:p@127.0.0.1:5984/sg.inv.hotels","feed":"longpoll","heartbeat":30000,
                 "channel":["a","b"],"since":"now","max_batch":50,"include_doc":true}
                """))
        #expect(configuration.feed == .longpoll && configuration.heartbeat == .seconds(30))
        #expect(configuration.channels == ["a", "b"] && configuration.initialSince == "now")
        #expect(configuration.maxBatch == 50 && configuration.includeDocs && configuration.url.user == "u")
        let bad: [(String, String)] = [
            (#"{"db_url":"ftp://x/db"}"#, "feeds[0].db_url"),
            (#"{"db_url":"http://h/db","feed":"normal"}"#, "feeds[0].feed"),
            (#"{"db_url":"http://h/db","since":"5"}"#, "feeds[0].since"), (#"{}"#, "feeds[0].db_url"),
            (#"{"db_url":"http://h/db","heartbeat":0}"#, "feeds[0].heartbeat"),
        ]
        for (json, key) in bad {
            let error = expectRelayError(.configuration) {
                try CouchDBChangeSource.Configuration(settings: try settings(json))
            }
            #expect(error?.message.hasPrefix(key) == true, "\(json)")
        }
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        expectRelayError(.configuration) {
            try FeedKind.couchdb.makeSource(try settings(#"{"db_url":"http://h/db","slot":"x"}"#), logger: logger)
        }
        let source = try FeedKind.couchdb.makeSource(try settings(#"{"db_url":"http://h:1/db"}"#), logger: logger)
        #expect(source.sourceID == "couchdb:h:1/db")
    }
}
