import NIOCore
import Testing

@testable import PubSubBench

/// The long-polling generator's HTTP/1.1 response framer, fed whole, byte by byte and in odd splits.
@Suite struct HTTPResponseFramerTests {
    typealias Response = HTTPResponseFramer.Response

    /// Feeds `parts` one after the other and collects every response, then the end of the connection.
    static func frame(_ parts: [String], end: Bool = false) throws -> [Response] {
        var framer = HTTPResponseFramer()
        var out: [Response] = []
        for part in parts {
            framer.feed(ByteBuffer(string: part))
            while let r = try framer.next() { out.append(r) }
        }
        if end, let r = try framer.end() { out.append(r) }
        return out
    }

    /// Every way of cutting `text` in two, and byte by byte, gives `expected`.
    static func expectSplits(_ text: String, _ expected: [Response], end: Bool = false) throws {
        #expect(try frame([text], end: end) == expected)
        let bytes = Array(text.utf8)
        for cut in 1..<bytes.count {
            let a = String(decoding: bytes[..<cut], as: UTF8.self)
            let b = String(decoding: bytes[cut...], as: UTF8.self)
            #expect(try frame([a, b], end: end) == expected, "cut at \(cut)")
        }
        #expect(try frame(bytes.map { String(decoding: [$0], as: UTF8.self) }, end: end) == expected)
    }

    static func response(_ status: Int, _ body: String, keepAlive: Bool = true) -> Response {
        Response(status: status, body: ByteBuffer(string: body), keepAlive: keepAlive)
    }

    @Test func contentLength() throws {
        let body = #"[{"channel":"/meta/connect","successful":true}]"#
        let text =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
        try Self.expectSplits(text, [Self.response(200, body)])
    }

    @Test func twoResponsesInOneRead() throws {
        let text = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 3\r\n\r\n[1]"
        try Self.expectSplits(text, [Self.response(200, "[]"), Self.response(200, "[1]")])
    }

    @Test func chunked() throws {
        // As puma sends a Rack body without length: chunk extensions and a trailer are allowed too.
        let text =
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[{\"a\"\r\nA;ext=1\r\n:1},{\"b\":2\r\n2\r\n}]\r\n0\r\nX-Trailer: t\r\n\r\n"
        try Self.expectSplits(text, [Self.response(200, #"[{"a":1},{"b":2}]"#)])
    }

    @Test func chunkedThenKeepAliveResponse() throws {
        let text =
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n"
            + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        // Only `chunked` last is understood; `gzip, chunked` frames like chunked (the body bytes are not decoded).
        try Self.expectSplits(text, [Self.response(200, "[]"), Self.response(200, "")])
    }

    @Test func errorStatusKeepsItsBody() throws {
        let text = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\nConnection: close\r\n\r\ntoo loaded."
        try Self.expectSplits(text, [Self.response(503, "too loaded.", keepAlive: false)])
    }

    @Test func bodyUntilClose() throws {
        // HTTP/1.0 without length: the body runs to the end of the connection.
        let text = "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n\r\nbad JSON"
        try Self.expectSplits(text, [Self.response(400, "bad JSON", keepAlive: false)], end: true)
        #expect(try Self.frame([text]) == [])
    }

    @Test func keepAliveRules() throws {
        #expect(
            try Self.frame(["HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"]) == [
                Self.response(200, "", keepAlive: false)
            ])
        #expect(
            try Self.frame(["HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n"])
                == [Self.response(200, "")])
        #expect(
            try Self.frame(["HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n"])
                == [Self.response(200, "", keepAlive: false)])
    }

    @Test func interimAndBodilessStatuses() throws {
        let text =
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]"
        try Self.expectSplits(text, [Self.response(204, ""), Self.response(200, "[]")])
    }

    @Test func endInsideAResponseFails() throws {
        var framer = HTTPResponseFramer()
        framer.feed(ByteBuffer(string: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n[1,"))
        #expect(try framer.next() == nil)
        #expect(framer.isMidResponse)
        #expect(throws: HTTPResponseFramer.Failure.self) { try framer.end() }
        var idle = HTTPResponseFramer()
        #expect(!idle.isMidResponse)
        #expect(try idle.end() == nil)
    }

    @Test(arguments: [
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 2x0 OK\r\n\r\n",
        "SMTP/1.1 200 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 12a\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc\r\n",
    ])
    func malformed(_ text: String) {
        #expect(throws: HTTPResponseFramer.Failure.self) { _ = try Self.frame([text]) }
    }

    @Test func bounds() {
        var framer = HTTPResponseFramer(maxHeadBytes: 64, maxBodyBytes: 8)
        framer.feed(ByteBuffer(string: "HTTP/1.1 200 OK\r\nX-Long: " + String(repeating: "a", count: 80)))
        #expect(throws: HTTPResponseFramer.Failure.self) { _ = try framer.next() }
        var body = HTTPResponseFramer(maxHeadBytes: 64, maxBodyBytes: 8)
        body.feed(ByteBuffer(string: "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"))
        #expect(throws: HTTPResponseFramer.Failure.self) { _ = try body.next() }
    }

    @Test func decimal() {
        for n in [0, 7, 9, 10, 99, 100, 12345, 1 << 40, Int.max] {
            var b = ByteBuffer()
            b.writeDecimal(n)
            #expect(String(buffer: b) == String(n))
            #expect(decimalDigits(n) == String(n).count)
        }
    }
}

/// The reply checks of `ReplyScanner` that spare the generator a JSON parse.
@Suite struct ReplyScannerTests {
    static func scan(_ text: String) -> (events: [ReplyScanner.Marker], connects: Int, acks: Int, others: [String])? {
        var events: [ReplyScanner.Marker] = []
        var connects = 0
        var acks = 0
        var others: [String] = []
        let ok = Array(text.utf8).withUnsafeBytes { bytes in
            ReplyScanner.scan(bytes) { item in
                switch item {
                case .event(let m): events.append(m)
                case .other(let o):
                    switch ReplyScanner.plainSuccess(o) {
                    case .connect?: connects += 1
                    case .publish?: acks += 1
                    case nil: others.append(String(decoding: o, as: UTF8.self))
                    }
                }
            }
        }
        return ok ? (events, connects, acks, others) : nil
    }

    @Test func fayeLongPollReply() throws {
        // As Faye answers a long poll: the events, then the /meta/connect reply with its advice.
        let text =
            #"[{"channel":"/bench/r/fanout","data":{"_pb":[0,0,7,123456789],"x":"xx"},"id":"4"},"#
            + #"{"id":"9","clientId":"abc","channel":"/meta/connect","successful":true,"advice":{"reconnect":"retry","interval":0,"timeout":45000}}]"#
        let r = try #require(Self.scan(text))
        #expect(r.events == [ReplyScanner.Marker(publisher: 0, channel: 0, sequence: 7, sentAt: 123_456_789)])
        #expect(r.connects == 1)
        #expect(r.others.isEmpty)
    }

    @Test func cometdStyleSpacing() throws {
        let r = try #require(
            Self.scan(#"[ { "successful" : true , "channel" : "/meta/connect" , "ext" : {"x":[1,2]} } ]"#))
        #expect(r.connects == 1)
    }

    @Test func publishAcknowledgements() throws {
        let r = try #require(
            Self.scan(
                #"[{"id":"1","channel":"/bench/r/fanout","successful":true},{"channel":"/a/b","successful":true,"id":"2"}]"#
            ))
        #expect(r.acks == 2)
        #expect(r.connects == 0)
        #expect(r.others.isEmpty)
    }

    @Test(arguments: [
        // Unsuccessful, with reconnect advice: parsed in full by the client.
        #"[{"channel":"/meta/connect","successful":false,"error":"401::No client","advice":{"reconnect":"handshake"}}]"#,
        #"[{"channel":"/meta/connect","successful":false,"advice":{"reconnect":"none"}}]"#,
        // Another meta channel, and the marker words only nested inside data.
        #"[{"channel":"/meta/subscribe","successful":true}]"#,
        #"[{"channel":"/x","data":{"channel":"/meta/connect","successful":true}}]"#,
        #"[{"channel":"/meta/connect","successful":"true"}]"#,
        #"[{"channel":"/meta/handshake","successful":true,"clientId":"abc"}]"#,
        // A failed publish, an event without a marker, a reply without a channel.
        #"[{"channel":"/bench/x","successful":false,"error":"403::Forbidden"}]"#,
        #"[{"channel":"/bench/x","successful":true,"data":{"hello":1}}]"#,
        #"[{"successful":true,"id":"3"}]"#,
    ])
    func notPlainSuccess(_ text: String) throws {
        let r = try #require(Self.scan(text))
        #expect(r.connects == 0)
        #expect(r.acks == 0)
        #expect(r.others.count == 1)
    }

    @Test func centrifugeLines() throws {
        // As a Centrifuge node writes a frame: a publication, a reply, another publication, one per line.
        let text =
            #"{"result":{"channel":"/bench/r/fanout","data":{"data":{"_pb":[0,0,3,42],"x":"x"}}}}"# + "\n"
            + #"{"id":7,"result":{}}"# + "\n"
            + #"{"result":{"channel":"/bench/r/fanout","data":{"data":{"_pb":[0,0,4,43]}}}}"# + "\n"
        let r = try #require(Self.scan(text))
        #expect(r.events.map(\.sequence) == [3, 4])
        #expect(r.others == [#"{"id":7,"result":{}}"#])
        #expect(Self.scan(#"{"id":1,"result":{}} x"#) == nil)
    }

    @Test func centrifugeReplies() {
        func reply(_ text: String) -> (id: Int, error: String?)? {
            Array(text.utf8).withUnsafeBytes { ReplyScanner.commandReply($0) }
        }
        #expect(reply(#"{"id":12,"result":{"client":"c","version":""}}"#).map { $0.id } == 12)
        #expect(reply(#"{"id":12,"result":{}}"#)?.error == nil)
        let failed = reply(#"{"id":3,"error":{"code":103,"message":"permission denied"}}"#)
        #expect(failed?.id == 3)
        #expect(failed?.error == #"{"code":103,"message":"permission denied"}"#)
        // A push has no id.
        #expect(reply(#"{"result":{"type":1,"channel":"c","data":{}}}"#) == nil)
    }

    @Test func fields() {
        var seen: [String] = []
        let ok = Array(#"{"a":"x\"y","b":[1,{"c":2}],"d":null , "e":-1.5e3}"#.utf8).withUnsafeBytes { bytes in
            ReplyScanner.forEachField(bytes) { k, v in
                seen.append(String(decoding: k, as: UTF8.self) + "=" + String(decoding: v, as: UTF8.self))
            }
        }
        #expect(ok)
        #expect(seen == [#"a="x\"y""#, #"b=[1,{"c":2}]"#, "d=null", "e=-1.5e3"])
        for bad in [#"{"a" 1}"#, #"{"a":}"#, #"{"a":1"#, #"["a"]"#, #"{"a":1 "b":2}"#] {
            let good = Array(bad.utf8).withUnsafeBytes { ReplyScanner.forEachField($0) { _, _ in } }
            #expect(!good, "\(bad)")
        }
    }
}
