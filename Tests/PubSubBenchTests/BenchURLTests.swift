import PubSubBench
import Testing

/// `--url` of `pubsub bench`: host and port split by the shared URLAuthority.
@Suite struct BenchURLTests {
    @Test func parses() throws {
        #expect(BenchURL("http://127.0.0.1:9292/faye") == BenchURL(host: "127.0.0.1", port: 9292, path: "/faye"))
        #expect(BenchURL("ws://example.test/faye") == BenchURL(host: "example.test", port: 80, path: "/faye"))
        #expect(BenchURL("127.0.0.1:9292") == BenchURL(host: "127.0.0.1", port: 9292, path: "/"))
        #expect(BenchURL("http://[::1]:9292/faye") == BenchURL(host: "::1", port: 9292, path: "/faye"))
    }

    @Test(arguments: [
        "", "https://h/faye", "wss://h/faye", "http://h:0/faye", "http://h:99999/", "http://h:x/",
        "http://u:p@h:1/", "http://[::1/faye", "http://:9292/faye",
    ])
    func rejects(_ text: String) {
        #expect(BenchURL(text) == nil)
    }
}
