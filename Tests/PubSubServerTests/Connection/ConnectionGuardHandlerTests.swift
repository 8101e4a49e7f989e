import Bayeux
import Foundation
import Logging
import NIOCore
import NIOEmbedded
import NIOHTTP1
import NIOWebSocket
import Prometheus
import PubSubCore
import Testing

@testable import PubSubServer

/// Stands in front of the pipeline as the socket would, recording half-closures: `EmbeddedChannel` closes
/// everything on any close, which would hide whether the guard closed the output only. With `holdWrites`, writes
/// wait (as they do for a slow reader) until `releaseWrites()`.
final class HalfCloseRecorder: ChannelOutboundHandler {
    typealias OutboundIn = NIOAny
    var outputClosed = 0
    var fullCloses = 0
    var holdWrites = false
    /// Reads asked of the socket.
    var reads = 0
    private var held: [(NIOAny, EventLoopPromise<Void>?)] = []
    private var context: ChannelHandlerContext?

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if holdWrites { held.append((data, promise)) } else { context.write(data, promise: promise) }
    }

    func flush(context: ChannelHandlerContext) {
        if !holdWrites { context.flush() }
    }
    func read(context: ChannelHandlerContext) {
        reads += 1
        context.read()
    }

    func releaseWrites() {
        holdWrites = false
        guard let context else { return }
        for (data, promise) in held { context.write(data, promise: promise) }
        held = []
        context.flush()
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode == .output {
            outputClosed += 1
            promise?.succeed(())
        } else {
            fullCloses += 1
            context.close(mode: mode, promise: promise)
        }
    }
}

/// The HTTP pipeline of a real connection (`PubSubServer.configureHTTP`) on an embedded channel: raw bytes in,
/// raw bytes out, time advanced by hand.
struct HTTPPipeline {
    let loop = EmbeddedEventLoop()
    let channel: EmbeddedChannel
    let shared: ServerShared
    let recorder = HalfCloseRecorder()

    init(_ configuration: ServerConfiguration = ServerConfiguration()) throws {
        channel = EmbeddedChannel(loop: loop)
        let logger = Logger(label: "test")
        let operations = ServerOperations(
            configuration: configuration.operations, loops: [loop], registry: PrometheusCollectorRegistry(),
            logger: logger)
        shared = ServerShared(
            configuration: configuration, broker: Broker(configuration: configuration.broker), logger: logger,
            operations: operations)
        let upgrader = WebSocketUpgrader(shouldUpgrade: { _, _ in false }, upgradePipeline: { _, _ in })
        try channel.pipeline.syncOperations.addHandler(recorder)
        try PubSubServer.configureHTTP(channel: channel, shared: shared, upgrader: upgrader)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 4000)).wait()
    }

    func send(_ text: String) throws { try channel.writeInbound(ByteBuffer(string: text)) }
    func send(bytes count: Int) throws {
        try channel.writeInbound(ByteBuffer(repeating: UInt8(ascii: "1"), count: count))
    }

    /// Everything written to the socket so far.
    func output() throws -> String {
        var text = ""
        while let data = try channel.readOutbound(as: IOData.self) {
            if case .byteBuffer(let buffer) = data { text += String(buffer: buffer) }
        }
        return text
    }
}

/// A response split into its head lines and its body, read off the wire text.
struct WireResponse {
    var status: String
    var headers: [String: String]
    var body: String

    /// Splits `text` into responses, each body as long as its `Content-Length` says, except the answers to HEAD
    /// requests (their indices in `heads`), which have none whatever the length says. What is left over after
    /// the last complete response is returned as a last response with an empty status.
    static func parse(_ text: String, heads: Set<Int> = []) -> [WireResponse] {
        var rest = Substring(text)
        var responses: [WireResponse] = []
        while let end = rest.range(of: "\r\n\r\n") {
            let lines = rest[..<end.lowerBound].split(separator: "\r\n")
            var headers: [String: String] = [:]
            for line in lines.dropFirst() {
                let parts = line.split(separator: ":", maxSplits: 1)
                if parts.count == 2 { headers[parts[0].lowercased()] = String(parts[1].drop(while: { $0 == " " })) }
            }
            rest = rest[end.upperBound...]
            let length = heads.contains(responses.count) ? 0 : headers["content-length"].flatMap(Int.init) ?? 0
            let body = rest.prefix(length)
            rest = rest.dropFirst(body.count)
            responses.append(WireResponse(status: String(lines.first ?? ""), headers: headers, body: String(body)))
        }
        if !rest.isEmpty { responses.append(WireResponse(status: "", headers: [:], body: String(rest))) }
        return responses
    }
}

@Suite struct HeadRequestTests {
    @Test func headThenGetOnOneConnectionStaysInStep() throws {
        let p = try HTTPPipeline()
        try p.send("HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        let responses = WireResponse.parse(try p.output(), heads: [0])
        #expect(responses.count == 2, "\(responses)")
        guard responses.count == 2 else { return }
        #expect(responses[0].status == "HTTP/1.1 200 OK")
        #expect(responses[0].headers["content-length"] == "3")
        #expect(responses[0].body == "")
        #expect(responses[1].status == "HTTP/1.1 200 OK")
        #expect(responses[1].body == "ok\n")
        #expect(p.channel.isActive)
    }

    @Test func headOfTheClientScriptHasTheLengthOfTheScript() throws {
        let p = try HTTPPipeline()
        try p.send("HEAD /faye/client.js HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        let responses = WireResponse.parse(try p.output(), heads: [0])
        #expect(responses.count == 2)
        guard responses.count == 2 else { return }
        #expect(responses[0].status == "HTTP/1.1 200 OK")
        #expect(responses[0].headers["content-length"] == String(BrowserClient.source.utf8.count))
        #expect(responses[0].headers["content-type"]?.hasPrefix("text/javascript") == true)
        #expect(responses[1].body == "ok\n")
    }

    @Test func headOfA404HasTheLengthOfItsText() throws {
        let p = try HTTPPipeline()
        try p.send("GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\nHEAD /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
        let responses = WireResponse.parse(try p.output(), heads: [1])
        #expect(responses.count == 2)
        guard responses.count == 2 else { return }
        #expect(responses[0].status == "HTTP/1.1 404 Not Found")
        #expect(responses[1].status == "HTTP/1.1 404 Not Found")
        #expect(responses[1].headers["content-length"] == String(responses[0].body.utf8.count))
        #expect(responses[1].body == "")
    }

    @Test func headOnTheBayeuxMountRunsNoMessage() throws {
        let message =
            "%5B%7B%22channel%22%3A%22%2Fmeta%2Fhandshake%22%2C%22version%22%3A%221.0%22%2C"
            + "%22supportedConnectionTypes%22%3A%5B%22callback-polling%22%5D%7D%5D"
        let p = try HTTPPipeline()
        try p.send("HEAD /faye?message=\(message)&jsonp=cb HTTP/1.1\r\nHost: x\r\n\r\n")
        let head = WireResponse.parse(try p.output(), heads: [0])
        #expect(head.first?.status == "HTTP/1.1 405 Method Not Allowed")
        #expect(head.first?.headers["allow"] == "GET, POST, OPTIONS")
        #expect(p.shared.broker.engine.statistics.clients == 0)
        // The same request as a GET does run: the handshake makes a client.
        try p.send("GET /faye?message=\(message)&jsonp=cb HTTP/1.1\r\nHost: x\r\n\r\n")
        p.loop.run()
        let get = WireResponse.parse(try p.output())
        #expect(get.first?.status == "HTTP/1.1 200 OK")
        #expect(get.first?.body.contains("\"successful\":true") == true)
        #expect(p.shared.broker.engine.statistics.clients == 1)
    }
}

@Suite struct PlainTextResponseTests {
    @Test func notFoundSaysNosniffAndEchoesNothing() throws {
        let p = try HTTPPipeline()
        try p.send("GET /%3Cscript%3Ealert(1)%3C/script%3E HTTP/1.1\r\nHost: x\r\n\r\n")
        try p.send("GET /faye/%3Cscript%3Eevil.js HTTP/1.1\r\nHost: x\r\n\r\n")
        let responses = WireResponse.parse(try p.output())
        #expect(responses.count == 2)
        for response in responses {
            #expect(response.status == "HTTP/1.1 404 Not Found")
            #expect(response.headers["x-content-type-options"] == "nosniff")
            #expect(response.headers["content-type"] == "text/plain; charset=utf-8")
            #expect(!response.body.contains("script"))
            #expect(!response.body.contains("evil"))
        }
    }

    @Test func healthAndTooLargeSayNosniff() throws {
        var configuration = ServerConfiguration()
        configuration.maxRequestBytes = 10
        let p = try HTTPPipeline(configuration)
        try p.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try p.send("POST /faye HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        let responses = WireResponse.parse(try p.output())
        #expect(responses.map(\.status) == ["HTTP/1.1 200 OK", "HTTP/1.1 413 Payload Too Large"])
        for response in responses { #expect(response.headers["x-content-type-options"] == "nosniff") }
    }
}

@Suite struct LingeringCloseTests {
    func tooLargePipeline(lingerBytes: Int = 16 << 20) throws -> HTTPPipeline {
        var configuration = ServerConfiguration()
        configuration.maxRequestBytes = 100
        configuration.timeouts.lingerBytes = lingerBytes
        let p = try HTTPPipeline(configuration)
        try p.send("POST /faye HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        try p.send(bytes: 1000)
        return p
    }

    @Test func tooLargeIsAnsweredThenTheOutputClosedAndTheRestDrained() throws {
        let p = try tooLargePipeline()
        let responses = WireResponse.parse(try p.output())
        #expect(responses.first?.status == "HTTP/1.1 413 Payload Too Large")
        #expect(responses.first?.headers["connection"] == "close")
        #expect(p.recorder.outputClosed == 1)
        #expect(p.recorder.fullCloses == 0)
        #expect(p.channel.isActive, "the connection stays open to read what the client still sends")
        // The rest of the body, and anything after it, is read and dropped: never parsed as a request.
        for _ in 0..<50 { try p.send(bytes: 1000) }
        try p.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try p.output() == "")
        #expect(p.channel.isActive)
        // Nothing more for the linger read timeout: closed.
        p.loop.advanceTime(by: .milliseconds(1900))
        #expect(p.channel.isActive)
        p.loop.advanceTime(by: .milliseconds(100))
        #expect(!p.channel.isActive)
        #expect(p.recorder.fullCloses == 1)
    }

    @Test func lingeringEndsWhenTheClientHasSentTooMuch() throws {
        let p = try tooLargePipeline(lingerBytes: 10_000)
        #expect(p.recorder.outputClosed == 1)
        try p.send(bytes: 9000)
        #expect(p.channel.isActive)
        try p.send(bytes: 2000)
        #expect(!p.channel.isActive)
    }

    @Test func lingeringEndsAtItsTimeLimitHoweverSteadyTheClient() throws {
        let p = try tooLargePipeline()
        for _ in 0..<9 {
            p.loop.advanceTime(by: .seconds(1))
            #expect(p.channel.isActive)
            try p.send(bytes: 10)
        }
        p.loop.advanceTime(by: .seconds(1))
        #expect(!p.channel.isActive)
    }

    @Test func theEndOfADrainClosesAHalfReadRequestWithoutLingering() throws {
        let p = try HTTPPipeline()
        try p.send("POST /faye HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        p.channel.triggerUserOutboundEvent(ConnectionGuard.Event.abort, promise: nil)
        p.channel.close(promise: nil)
        #expect(!p.channel.isActive)
        #expect(p.recorder.outputClosed == 0)
    }

    @Test func closeAfterACompleteRequestDoesNotLinger() throws {
        let p = try HTTPPipeline()
        try p.send("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(WireResponse.parse(try p.output()).first?.body == "ok\n")
        #expect(p.recorder.outputClosed == 0)
        #expect(!p.channel.isActive)
    }

    @Test func refusedConnectionDrainsTheBodyAfterItsServiceUnavailable() throws {
        var configuration = OperationsConfiguration()
        configuration.maxConnections = 1
        let loop = EmbeddedEventLoop()
        let operations = ServerOperations(
            configuration: configuration, loops: [loop], registry: PrometheusCollectorRegistry(),
            logger: Logger(label: "test"))
        let makeGuard = { ConnectionGuard(timeouts: ConnectionTimeouts(), pingInterval: .seconds(30)) }
        let admitted = EmbeddedChannel(loop: loop)
        #expect(try operations.prepare(admitted, makeGuard: makeGuard))
        let refused = EmbeddedChannel(loop: loop)
        let recorder = HalfCloseRecorder()
        try refused.pipeline.syncOperations.addHandler(recorder)
        #expect(try operations.prepare(refused, makeGuard: makeGuard) == false)
        try refused.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 4000)).wait()
        try refused.writeInbound(ByteBuffer(string: "POST /faye HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"))
        var text = ""
        while let data = try refused.readOutbound(as: IOData.self) {
            if case .byteBuffer(let buffer) = data { text += String(buffer: buffer) }
        }
        let response = WireResponse.parse(text).first
        #expect(response?.status == "HTTP/1.1 503 Service Unavailable")
        #expect(response?.headers["retry-after"] == "1")
        #expect(recorder.outputClosed == 1)
        try refused.writeInbound(ByteBuffer(repeating: 0x31, count: 5000))
        #expect(refused.isActive)
        loop.advanceTime(by: .seconds(2))
        #expect(!refused.isActive)
    }

    func refusingOperations(maxConnections: Int) -> (EmbeddedEventLoop, ServerOperations) {
        var configuration = OperationsConfiguration()
        configuration.maxConnections = maxConnections
        let loop = EmbeddedEventLoop()
        let operations = ServerOperations(
            configuration: configuration, loops: [loop], registry: PrometheusCollectorRegistry(),
            logger: Logger(label: "test"))
        return (loop, operations)
    }

    func outboundText(_ channel: EmbeddedChannel) throws -> String {
        var text = ""
        while let data = try channel.readOutbound(as: IOData.self) {
            if case .byteBuffer(let buffer) = data { text += String(buffer: buffer) }
        }
        return text
    }

    @Test func refusedRequestWithoutABodyIsAnsweredAtItsEndAndClosedWithoutLingering() throws {
        let (loop, operations) = refusingOperations(maxConnections: 1)
        let makeGuard = { ConnectionGuard(timeouts: ConnectionTimeouts(), pingInterval: .seconds(30)) }
        #expect(try operations.prepare(EmbeddedChannel(loop: loop), makeGuard: makeGuard))
        let refused = EmbeddedChannel(loop: loop)
        let recorder = HalfCloseRecorder()
        try refused.pipeline.syncOperations.addHandler(recorder)
        #expect(try operations.prepare(refused, makeGuard: makeGuard) == false)
        try refused.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 4000)).wait()
        try refused.writeInbound(ByteBuffer(string: "GET /faye HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n"))
        let response = WireResponse.parse(try outboundText(refused)).first
        #expect(response?.status == "HTTP/1.1 503 Service Unavailable")
        #expect(response?.body == "Too many connections (limit 1); retry later\n")
        // The request was read whole: closed at once, not half-closed and lingering.
        #expect(recorder.outputClosed == 0)
        #expect(!refused.isActive)
    }

    @Test func connectionShedAtTheDescriptorCeilingIsAnswered503AndNotCounted() throws {
        let (loop, operations) = refusingOperations(maxConnections: 0)
        let makeGuard = { ConnectionGuard(timeouts: ConnectionTimeouts(), pingInterval: .seconds(30)) }
        let shed = EmbeddedChannel(loop: loop)
        operations.markShed(shed)
        #expect(try operations.prepare(shed, makeGuard: makeGuard) == false)
        #expect(operations.openConnections == 0)
        try shed.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 4000)).wait()
        try shed.writeInbound(ByteBuffer(string: "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
        let response = WireResponse.parse(try outboundText(shed)).first
        #expect(response?.status == "HTTP/1.1 503 Service Unavailable")
        #expect(response?.headers["retry-after"] == "1")
        #expect(response?.body == "No file descriptor left on the server; retry later\n")
        #expect(!shed.isActive)
        // Marked once: the next connection is served as usual.
        #expect(try operations.prepare(EmbeddedChannel(loop: loop), makeGuard: makeGuard))
        #expect(operations.openConnections == 1)
    }

    @Test func aSilentShedConnectionHoldsTheReserveForOneSecondAtMost() throws {
        let (loop, operations) = refusingOperations(maxConnections: 0)
        let makeGuard = { ConnectionGuard(timeouts: ConnectionTimeouts(), pingInterval: .seconds(30)) }
        let shed = EmbeddedChannel(loop: loop)
        operations.markShed(shed)
        #expect(try operations.prepare(shed, makeGuard: makeGuard) == false)
        try shed.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 4000)).wait()
        loop.advanceTime(by: .milliseconds(999))
        #expect(shed.isActive)
        loop.advanceTime(by: .milliseconds(1))
        #expect(!shed.isActive)
    }
}

@Suite struct ConnectionTimeoutHandlerTests {
    @Test func halfSentHeadIsClosedAtTheHeaderTimeout() throws {
        let p = try HTTPPipeline()
        try p.send("GET /healthz HTTP/1.1\r\nHo")
        p.loop.advanceTime(by: .seconds(9))
        try p.send("st: x\r\n")
        #expect(p.channel.isActive)
        p.loop.advanceTime(by: .seconds(1))
        #expect(!p.channel.isActive)
        // (The 400 that NIO's error handler writes for the cut request after the close reaches no socket; an
        // embedded channel keeps it.) The request was never served.
        let output = try p.output()
        #expect(!output.contains("200 OK"))
    }

    @Test func laterHalfSentHeadIsClosedAtTheHeaderTimeoutNotTheIdleOne() throws {
        let p = try HTTPPipeline()
        try p.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(WireResponse.parse(try p.output()).first?.body == "ok\n")
        p.loop.advanceTime(by: .seconds(1))
        try p.send("GET /hea")
        p.loop.advanceTime(by: .milliseconds(9999))
        #expect(p.channel.isActive)
        p.loop.advanceTime(by: .milliseconds(1))
        #expect(!p.channel.isActive)
    }

    @Test func pipelinedRequestsAreTimedFromTheLastResponse() throws {
        let p = try HTTPPipeline()
        p.recorder.holdWrites = true
        try p.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        p.recorder.releaseWrites()
        #expect(WireResponse.parse(try p.output()).count == 2)
        p.loop.advanceTime(by: .seconds(29))
        #expect(p.channel.isActive)
        p.loop.advanceTime(by: .seconds(1))
        #expect(!p.channel.isActive)
    }

    @Test func idleKeepAliveConnectionIsClosedAtTheIdleTimeout() throws {
        let p = try HTTPPipeline()
        try p.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(WireResponse.parse(try p.output()).first?.body == "ok\n")
        p.loop.advanceTime(by: .seconds(29))
        #expect(p.channel.isActive)
        p.loop.advanceTime(by: .seconds(1))
        #expect(!p.channel.isActive)
    }

    @Test func parkedLongPollIsNotCutByTheIdleTimeout() throws {
        var configuration = ServerConfiguration()
        configuration.broker.timeout = .seconds(60)
        let p = try HTTPPipeline(configuration)
        let handshake = #"[{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}]"#
        try p.send(
            "POST /faye HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \(handshake.utf8.count)\r\n\r\n\(handshake)"
        )
        p.loop.run()
        let reply = WireResponse.parse(try p.output()).first?.body ?? ""
        guard let idRange = reply.range(of: #""clientId":""#) else {
            Issue.record("no clientId in \(reply)")
            return
        }
        let clientId = String(reply[idRange.upperBound...].prefix(while: { $0 != "\"" }))
        let connect = #"[{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"long-polling"}]"#
        try p.send(
            "POST /faye HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \(connect.utf8.count)\r\n\r\n\(connect)"
        )
        p.loop.run()
        // The first connect is answered at once (Faye's rule); the second is held.
        _ = try p.output()
        try p.send(
            "POST /faye HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \(connect.utf8.count)\r\n\r\n\(connect)"
        )
        p.loop.run()
        p.loop.advanceTime(by: .seconds(45))
        #expect(p.channel.isActive, "a parked /meta/connect is a request in flight, not an idle connection")
    }

    @Test func silentWebSocketIsPingedThenClosed() throws {
        let loop = EmbeddedEventLoop()
        let channel = EmbeddedChannel(loop: loop)
        try channel.pipeline.syncOperations.addHandler(
            ConnectionGuard(timeouts: ConnectionTimeouts(), pingInterval: .seconds(30)))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 4000)).wait()
        let shared = ConnectionHandlerTests.makeShared(maxQueue: 10, recorder: ConnectionHandlerTests.LogRecorder())
        try channel.pipeline.syncOperations.addHandler(
            WebSocketHandler(shared: shared, remoteAddress: nil, eventLoop: channel.eventLoop))
        loop.advanceTime(by: .seconds(29))
        #expect(try WireFrames.written(channel).isEmpty)
        loop.advanceTime(by: .seconds(1))
        #expect(try WireFrames.written(channel).map(\.opcode) == [.ping])
        // A pong: alive for another interval.
        try channel.writeInbound(ByteBuffer(bytes: [0x8A, 0x80, 0, 0, 0, 0]))
        loop.advanceTime(by: .seconds(59))
        #expect(channel.isActive)
        #expect(try WireFrames.written(channel).map(\.opcode) == [.ping])
        loop.advanceTime(by: .seconds(30))
        #expect(!channel.isActive)
    }
}

/// A parked long-poll on the real HTTP pipeline: the socket stays read (no read interest turned off and on per
/// poll) until bytes arrive meanwhile, and its hold ends at its own deadline whatever timer entry is left.
@Suite struct ParkedLongPollTests {
    static func post(_ json: String) -> String {
        "POST /faye HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \(json.utf8.count)\r\n\r\n\(json)"
    }

    /// A handshaken client whose first connect has been answered, subscribed to `/x`.
    static func client(_ p: HTTPPipeline) throws -> String {
        try p.send(
            post(#"[{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}]"#))
        p.loop.run()
        let reply = WireResponse.parse(try p.output()).first?.body ?? ""
        let idRange = try #require(reply.range(of: #""clientId":""#))
        let clientId = String(reply[idRange.upperBound...].prefix(while: { $0 != "\"" }))
        try p.send(post(connect(clientId)))
        p.loop.run()
        try p.send(post(#"[{"channel":"/meta/subscribe","clientId":"\#(clientId)","subscription":"/x"}]"#))
        p.loop.run()
        #expect(WireResponse.parse(try p.output()).count == 2)
        return clientId
    }

    static func connect(_ clientId: String) -> String {
        #"[{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"long-polling"}]"#
    }

    static func pipeline() throws -> HTTPPipeline {
        var configuration = ServerConfiguration()
        configuration.broker.timeout = .seconds(60)
        return try HTTPPipeline(configuration)
    }

    @Test func parkedConnectKeepsReadingUntilBytesArrive() throws {
        let p = try Self.pipeline()
        let clientId = try Self.client(p)
        let before = p.recorder.reads
        try p.send(Self.post(Self.connect(clientId)))
        p.loop.run()
        #expect(try p.output().isEmpty, "the connect is held")
        #expect(p.recorder.reads == before + 1, "the guard reads on while the response is awaited")
        // A pipelined request meanwhile: read, but nothing more is until the held connect is answered.
        try p.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(p.recorder.reads == before + 1)
        #expect(try p.output().isEmpty, "one request in flight: the pipelined one waits")
        p.loop.advanceTime(by: .seconds(60))
        let responses = WireResponse.parse(try p.output())
        #expect(responses.count == 2)
        #expect(responses.first?.body.contains("/meta/connect") == true)
        #expect(responses.last?.body == "ok\n")
    }

    @Test func connectParkedAgainIsHeldForItsOwnHold() throws {
        let p = try Self.pipeline()
        let clientId = try Self.client(p)
        try p.send(Self.post(Self.connect(clientId)))
        p.loop.run()
        p.loop.advanceTime(by: .seconds(10))
        // A publish answers the held connect; the next one is held until 10 + 60 s, not the first one's 60 s.
        let publish = try JSONParser(maxDepth: 16).parse(Array(#"[{"channel":"/x","data":1}]"#.utf8))
        let elements = try #require(MessageBatch.elements(of: publish))
        _ = p.shared.broker.handle(
            elements, context: RequestContext(connectionType: .longPolling), sink: nil, now: .now(), on: p.loop)
        p.loop.run()
        let delivered = WireResponse.parse(try p.output())
        #expect(delivered.count == 1)
        #expect(delivered.first?.body.contains(#""channel":"/x""#) == true)
        try p.send(Self.post(Self.connect(clientId)))
        p.loop.run()
        p.loop.advanceTime(by: .seconds(50))
        #expect(try p.output().isEmpty, "at 60 s the first hold's timer entry fires early and finds nothing due")
        p.loop.advanceTime(by: .seconds(10))
        #expect(WireResponse.parse(try p.output()).first?.body.contains("/meta/connect") == true)
    }
}
