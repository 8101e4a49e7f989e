import Testing

@testable import PubSubClient

@Suite struct BayeuxURLTests {
    @Test func parsesWhatPeopleWrite() throws {
        let plain = try BayeuxURL("http://127.0.0.1:9292/faye")
        #expect((plain.host, plain.port, plain.path, plain.prefersWebSocket) == ("127.0.0.1", 9292, "/faye", false))
        let ws = try BayeuxURL("ws://localhost/faye?x=1#frag")
        #expect((ws.host, ws.port, ws.path, ws.prefersWebSocket) == ("localhost", 80, "/faye?x=1", true))
        let bare = try BayeuxURL("HTTP://example.com")
        #expect((bare.host, bare.path, bare.hostHeader) == ("example.com", "/", "example.com"))
        let v6 = try BayeuxURL("http://[::1]:8080/faye")
        #expect((v6.host, v6.port, v6.hostHeader) == ("::1", 8080, "[::1]:8080"))
        let user = try BayeuxURL("http://user:pw@h:81/p")
        #expect((user.host, user.port) == ("h", 81))
        let secure = try BayeuxURL("https://example.com/faye")
        #expect(
            (secure.secure, secure.port, secure.hostHeader, secure.tlsServerName) == (
                true, 443, "example.com", "example.com"
            ))
        #expect(secure.description == "https://example.com/faye")
        let wss = try BayeuxURL("wss://127.0.0.1:8443/faye")
        #expect(
            (wss.secure, wss.prefersWebSocket, wss.tlsServerName, wss.description) == (
                true, true, nil, "wss://127.0.0.1:8443/faye"
            ))
        #expect(try BayeuxURL("wss://[::1]/faye").tlsServerName == nil)
    }

    @Test func refusesWhatItCannotUse() {
        for text in [
            "127.0.0.1:9292/faye", "ftp://h/", "http://:80/", "http://h:0/", "http://h:99999/",
            "http://h:x/", "http://[::1/", "https://:443/faye",
        ] {
            #expect(throws: BayeuxClientError.self, "\(text)") { try BayeuxURL(text) }
        }
    }
}
