import Bayeux
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP1
import NIOWebSocket
import Prometheus
import Testing

@testable import PubSubCore
@testable import PubSubServer

/// The connection handlers on an `EmbeddedChannel`: they perform what the `ConnectionStateMachine` asks
/// (reading withheld while not writable, slow consumers dropped, heartbeats, binary frames read as JSON).
@Suite struct ConnectionHandlerTests {
    /// Keeps every log record, to check what a drop says.
    final class LogRecorder: Sendable {
        struct Record: Sendable {
            var level: Logger.Level
            var message: String
            var metadata: Logger.Metadata
        }
        let records = NIOLockedValueBox<[Record]>([])

        struct Handler: LogHandler {
            let recorder: LogRecorder
            var metadata: Logger.Metadata = [:]
            var logLevel: Logger.Level = .trace
            subscript(metadataKey key: String) -> Logger.Metadata.Value? {
                get { metadata[key] }
                set { metadata[key] = newValue }
            }
            func log(event: LogEvent) {
                recorder.records.withLockedValue {
                    $0.append(Record(level: event.level, message: "\(event.message)", metadata: event.metadata ?? [:]))
                }
            }
        }

        var logger: Logger { Logger(label: "test") { _ in Handler(recorder: self) } }

        func drops() -> [Record] {
            records.withLockedValue { $0.filter { $0.message.contains("slow consumer dropped") } }
        }
    }

    /// Counts the reads that reach the head of the pipeline.
    final class ReadCounter: ChannelOutboundHandler {
        typealias OutboundIn = Any
        var reads = 0
        func read(context: ChannelHandlerContext) {
            reads += 1
            context.read()
        }
    }

    static func makeShared(maxQueue: Int, pingInterval: TimeAmount = .seconds(30), recorder: LogRecorder)
        -> ServerShared
    {
        let configuration = ServerConfiguration(
            broker: BrokerConfiguration(maxQueue: maxQueue, historySize: 0), pingInterval: pingInterval)
        let operations = ServerOperations(
            configuration: configuration.operations, loops: [], registry: PrometheusCollectorRegistry(),
            logger: recorder.logger)
        let broker = Broker(configuration: configuration.broker, logger: recorder.logger)
        return ServerShared(
            configuration: configuration, broker: broker, logger: recorder.logger, operations: operations)
    }

    static func publish(_ n: Int, on channelName: String, shared: ServerShared, channel: EmbeddedChannel) {
        publish(n, on: channelName, shared: shared, loop: channel.embeddedEventLoop)
    }

    static func publish(_ n: Int, on channelName: String, shared: ServerShared, loop: EmbeddedEventLoop) {
        var event = Message()
        event.channel = channelName
        event["data"] = JSONValue(n)
        _ = shared.broker.engine.publish(event, to: channelName, now: .now(), on: loop)
        loop.run()
    }

    /// An embedded channel that is active (connected), so that a close shows.
    static func connectedChannel() throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        _ = channel.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 9))
        channel.embeddedEventLoop.run()
        #expect(channel.isActive)
        return channel
    }

    static func setWritable(_ writable: Bool, _ channel: EmbeddedChannel) {
        channel.isWritable = writable
        channel.pipeline.fireChannelWritabilityChanged()
        channel.embeddedEventLoop.run()
    }

    // MARK: WebSocket

    static func sendFrame(_ text: String, binary: Bool = false, _ channel: EmbeddedChannel) throws {
        try channel.writeInbound(WireFrames.bytes(binary ? .binary : .text, text))
        channel.embeddedEventLoop.run()
    }

    /// Every frame written so far, as parsed JSON (close frames as `close:<code>`).
    static func frames(_ channel: EmbeddedChannel) throws -> [JSONValue] {
        var out: [JSONValue] = []
        for frame in try WireFrames.written(channel) {
            if frame.opcode == .connectionClose {
                var data = frame.data
                let code = data.readInteger(as: UInt16.self).map(String.init) ?? "none"
                out.append(.string("close:\(code)"))
            } else {
                out.append(try JSONParser(maxDepth: 64).parse(frame.data))
            }
        }
        return out
    }

    static let handshake =
        #"[{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["websocket"],"id":"h"}]"#

    static func webSocket(maxQueue: Int, recorder: LogRecorder) throws
        -> (EmbeddedChannel, ReadCounter, ServerShared, String)
    {
        try webSocket(shared: makeShared(maxQueue: maxQueue, recorder: recorder))
    }

    /// A WebSocket whose client is subscribed to `/x` and holds a connect.
    static func webSocket(shared: ServerShared) throws -> (EmbeddedChannel, ReadCounter, ServerShared, String) {
        let reads = ReadCounter()
        let channel = try Self.connectedChannel()
        try channel.pipeline.syncOperations.addHandler(reads)
        try channel.pipeline.syncOperations.addHandler(
            WebSocketHandler(shared: shared, remoteAddress: nil, eventLoop: channel.eventLoop))
        try sendFrame(handshake, channel)
        let reply = try frames(channel)
        let clientId = try #require(reply.first?.arrayValue?.first?.objectValue?["clientId"]?.stringValue)
        try sendFrame(
            #"[{"channel":"/meta/subscribe","clientId":"\#(clientId)","subscription":"/x","id":"s"},"#
                + #"{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"websocket","id":"c1"}]"#,
            channel)
        #expect(try frames(channel).count == 1)
        // The second connect is held.
        try sendFrame(
            #"[{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"websocket","id":"c2"}]"#, channel)
        #expect(try frames(channel).isEmpty)
        return (channel, reads, shared, clientId)
    }

    @Test func unwritableWebSocketStopsReadingAndDropsTheClientPastMaxQueue() async throws {
        let recorder = LogRecorder()
        let (channel, reads, shared, clientId) = try Self.webSocket(maxQueue: 3, recorder: recorder)
        Self.publish(1, on: "/x", shared: shared, channel: channel)
        #expect(try Self.frames(channel).count == 1, "writable: delivered at once")

        Self.setWritable(false, channel)
        let before = reads.reads
        channel.read()
        #expect(reads.reads == before, "no read while writes drain")
        for n in 2...4 { Self.publish(n, on: "/x", shared: shared, channel: channel) }
        #expect(try Self.frames(channel).isEmpty, "events wait in the backlog")
        #expect(channel.isActive)
        #expect(shared.broker.engine.statistics.overflowDrops == 0)

        Self.publish(5, on: "/x", shared: shared, channel: channel)
        #expect(try Self.frames(channel) == [.string("close:1008")])
        #expect(!channel.isActive)
        #expect(shared.broker.engine.statistics.overflowDrops == 1)
        let drops = recorder.drops()
        #expect(drops.count == 1)
        #expect(drops.first?.level == .info)
        #expect(drops.first?.metadata["pubsub.client.id"] == .string(clientId))
        #expect(drops.first?.metadata["pubsub.transport"] == .string("websocket"))
        // The session is gone: its next connect is told why.
        let result = try await shared.broker.engine.connect(clientId, now: .now(), sink: nil, on: channel.eventLoop)
            .get()
        #expect(result.status == .overflowed)
    }

    /// A broadcast event goes out as one write of the shared encoded buffer, its frame header written once
    /// when it was encoded (`WireEvent.frame`): no header buffer per recipient, no second write.
    @Test func aDeliveredEventIsOneWriteOfTheWholeFrame() throws {
        let recorder = LogRecorder()
        let (channel, _, shared, _) = try Self.webSocket(maxQueue: 10, recorder: recorder)
        Self.publish(7, on: "/x", shared: shared, channel: channel)
        let written = try #require(try channel.readOutbound(as: IOData.self))
        #expect(try channel.readOutbound(as: IOData.self) == nil, "one write")
        guard case .byteBuffer(var frame) = written else {
            Issue.record("not a buffer")
            return
        }
        let payload = frame.readableBytes - 2
        #expect(frame.readInteger(as: UInt8.self) == 0x81, "a final text frame")
        #expect(frame.readInteger(as: UInt8.self) == UInt8(payload), "unmasked, of the payload's length")
        let parsed = try JSONParser(maxDepth: 8).parse(frame)
        #expect(parsed.arrayValue?.first?.objectValue?["data"] == JSONValue(7))
    }

    @Test func webSocketResumesReadingAndSendsTheBacklogWhenWritesDrain() throws {
        let recorder = LogRecorder()
        let (channel, reads, shared, _) = try Self.webSocket(maxQueue: 10, recorder: recorder)
        Self.setWritable(false, channel)
        let before = reads.reads
        channel.read()
        Self.publish(1, on: "/x", shared: shared, channel: channel)
        Self.publish(2, on: "/x", shared: shared, channel: channel)
        #expect(try Self.frames(channel).isEmpty)
        Self.setWritable(true, channel)
        #expect(reads.reads == before + 1, "the withheld read is asked for")
        let sent = try Self.frames(channel)
        #expect(sent.count == 1, "the backlog goes in one frame")
        #expect(sent.first?.arrayValue?.compactMap { $0.objectValue?["data"] } == [JSONValue(1), JSONValue(2)])
        #expect(recorder.drops().isEmpty)
    }

    @Test func quiescedWebSocketAnswersItsConnectSendsWhatWaitsAndCloses1001() throws {
        let recorder = LogRecorder()
        let (channel, _, shared, _) = try Self.webSocket(maxQueue: 10, recorder: recorder)
        Self.setWritable(false, channel)
        Self.publish(1, on: "/x", shared: shared, channel: channel)
        channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        channel.embeddedEventLoop.run()
        let sent = try Self.frames(channel)
        // The reply and what waited go in one frame (the reply never overtakes an event handed out before it).
        #expect(sent.count == 2)
        #expect(sent.first?.arrayValue?.first?.objectValue?["id"] == .string("c2"))
        #expect(sent.first?.arrayValue?.first?.objectValue?["successful"] == .bool(true))
        #expect(sent.first?.arrayValue?.dropFirst().first?.objectValue?["data"] == JSONValue(1))
        #expect(sent.last == .string("close:1001"))
        #expect(!channel.isActive)
    }

    @Test func outboundBudgetSetsTheWaterMarks() {
        let marks = ServerConfiguration(maxOutboundBytes: 65536).writeBufferWaterMark
        #expect(marks.high == 65536)
        #expect(marks.low == 32768)
        #expect(ServerConfiguration().writeBufferWaterMark.high == 1 << 20)
    }

    @Test func binaryFrameWithJSONIsAnsweredAndGarbageGetsAnErrorReply() throws {
        let recorder = LogRecorder()
        let shared = Self.makeShared(maxQueue: 10, recorder: recorder)
        let channel = try Self.connectedChannel()
        try channel.pipeline.syncOperations.addHandler(
            WebSocketHandler(shared: shared, remoteAddress: nil, eventLoop: channel.eventLoop))
        try Self.sendFrame(Self.handshake, binary: true, channel)
        let reply = try Self.frames(channel)
        let first = try #require(reply.first?.arrayValue?.first?.objectValue)
        #expect(first["successful"] == .bool(true))
        #expect(first["channel"] == .string("/meta/handshake"))
        let clientId = try #require(first["clientId"]?.stringValue)

        try channel.writeInbound(
            WireFrames.bytes(.binary, [0xff, 0x00, 0xfe, 0x7b]))
        channel.embeddedEventLoop.run()
        let error = try Self.frames(channel)
        #expect(error.count == 1)
        #expect(error.first?.arrayValue?.first?.objectValue?["successful"] == .bool(false))
        #expect(channel.isActive, "the session goes on")

        try Self.sendFrame(
            #"[{"channel":"/meta/subscribe","clientId":"\#(clientId)","subscription":"/b","id":"s"}]"#, binary: true,
            channel)
        #expect(try Self.frames(channel).first?.arrayValue?.first?.objectValue?["successful"] == .bool(true))
    }

    // MARK: EventSource

    static func httpHandler(shared: ServerShared) -> HTTPHandler {
        HTTPHandler(shared: shared)
    }

    /// The body bytes written so far, and whether the response ended.
    static func streamed(_ channel: EmbeddedChannel) throws -> (head: HTTPResponseHead?, body: String, ended: Bool) {
        var head: HTTPResponseHead?
        var body = ""
        var ended = false
        while let part = try channel.readOutbound(as: HTTPServerResponsePart.self) {
            switch part {
            case .head(let h): head = h
            case .body(.byteBuffer(let b)): body += String(buffer: b)
            case .body: break
            case .end: ended = true
            }
        }
        return (head, body, ended)
    }

    static func eventSource(maxQueue: Int, recorder: LogRecorder) async throws
        -> (EmbeddedChannel, ReadCounter, ServerShared, String)
    {
        let shared = makeShared(maxQueue: maxQueue, pingInterval: .milliseconds(50), recorder: recorder)
        let reads = ReadCounter()
        let channel = try Self.connectedChannel()
        try channel.pipeline.syncOperations.addHandler(reads)
        try channel.pipeline.syncOperations.addHandler(httpHandler(shared: shared))
        let engine = shared.broker.engine
        let clientId = try await engine.createClient(now: .now(), on: channel.eventLoop).get()
        _ = try await engine.subscribe(clientId, to: ["/x"], resume: nil, now: .now(), on: channel.eventLoop).get()
        var headers = HTTPHeaders()
        headers.add(name: "Accept", value: "text/event-stream")
        try channel.writeInbound(
            HTTPServerRequestPart.head(
                HTTPRequestHead(version: .http1_1, method: .GET, uri: "/faye/\(clientId)", headers: headers)))
        try channel.writeInbound(HTTPServerRequestPart.end(nil))
        channel.embeddedEventLoop.run()
        let opened = try streamed(channel)
        #expect(opened.head?.status == .ok)
        #expect(opened.body == "retry: 5000\r\n\r\n")
        return (channel, reads, shared, clientId)
    }

    @Test func eventSourceSendsEventsAndHeartbeats() async throws {
        let recorder = LogRecorder()
        let (channel, _, shared, _) = try await Self.eventSource(maxQueue: 10, recorder: recorder)
        Self.publish(7, on: "/x", shared: shared, channel: channel)
        #expect(try Self.streamed(channel).body == "data: [{\"channel\":\"/x\",\"data\":7}]\r\n\r\n")
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(50))
        #expect(try Self.streamed(channel).body == ":\n\n")
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(50))
        #expect(try Self.streamed(channel).body == ":\n\n", "every interval")
        Self.setWritable(false, channel)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(50))
        #expect(try Self.streamed(channel).body == "", "no heartbeat while writes drain")
        Self.setWritable(true, channel)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(50))
        #expect(try Self.streamed(channel).body == ":\n\n")
    }

    @Test func unwritableEventSourceStopsReadingAndDropsTheClientPastMaxQueue() async throws {
        let recorder = LogRecorder()
        let (channel, reads, shared, clientId) = try await Self.eventSource(maxQueue: 3, recorder: recorder)
        Self.setWritable(false, channel)
        let before = reads.reads
        channel.read()
        #expect(reads.reads == before, "no read while writes drain")
        for n in 1...3 { Self.publish(n, on: "/x", shared: shared, channel: channel) }
        #expect(try Self.streamed(channel).body == "", "events wait in the backlog")
        #expect(channel.isActive)

        Self.publish(4, on: "/x", shared: shared, channel: channel)
        let ended = try Self.streamed(channel)
        #expect(ended.ended)
        #expect(ended.body == "")
        #expect(!channel.isActive)
        #expect(shared.broker.engine.statistics.overflowDrops == 1)
        let drops = recorder.drops()
        #expect(drops.count == 1)
        #expect(drops.first?.metadata["pubsub.client.id"] == .string(clientId))
        #expect(drops.first?.metadata["pubsub.transport"] == .string("eventsource"))
    }

    @Test func eventSourceSendsTheBacklogWhenWritesDrain() async throws {
        let recorder = LogRecorder()
        let (channel, reads, shared, _) = try await Self.eventSource(maxQueue: 3, recorder: recorder)
        Self.setWritable(false, channel)
        channel.read()
        let before = reads.reads
        for n in 1...3 { Self.publish(n, on: "/x", shared: shared, channel: channel) }
        Self.setWritable(true, channel)
        #expect(reads.reads == before + 1)
        let body = try Self.streamed(channel).body
        #expect(body.split(separator: "\r\n\r\n").filter { $0.hasPrefix("data: ") }.count == 3)
        #expect(channel.isActive)
    }

    /// A stream that ends with events still waiting (the server drains) writes them as stream events, then
    /// ends: nothing of an HTTP response is written into the stream.
    @Test func eventSourceEndingWithABacklogSendsItAsStreamEvents() async throws {
        let recorder = LogRecorder()
        let (channel, _, shared, _) = try await Self.eventSource(maxQueue: 10, recorder: recorder)
        Self.setWritable(false, channel)
        for n in 1...2 { Self.publish(n, on: "/x", shared: shared, channel: channel) }
        #expect(try Self.streamed(channel).body == "")
        shared.broker.engine.shutdown()
        channel.embeddedEventLoop.run()
        let streamed = try Self.streamed(channel)
        #expect(streamed.head == nil, "no response head inside the stream")
        #expect(streamed.body.split(separator: "\r\n\r\n").filter { $0.hasPrefix("data: ") }.count == 2)
        #expect(streamed.ended)
    }

    // MARK: Long-polling

    static func post(_ json: String, _ channel: EmbeddedChannel) throws {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: "\(json.utf8.count)")
        try channel.writeInbound(
            HTTPServerRequestPart.head(
                HTTPRequestHead(version: .http1_1, method: .POST, uri: "/faye", headers: headers)))
        try channel.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: json)))
        try channel.writeInbound(HTTPServerRequestPart.end(nil))
        channel.embeddedEventLoop.run()
    }

    @Test func parkedLongPollIsAnsweredByTheFirstDeliveryAndItsHoldEnd() throws {
        let recorder = LogRecorder()
        let shared = Self.makeShared(maxQueue: 10, recorder: recorder)
        let channel = try Self.connectedChannel()
        try channel.pipeline.syncOperations.addHandler(Self.httpHandler(shared: shared))
        try Self.post(
            #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#, channel)
        let handshake = try JSONParser(maxDepth: 64).parse(ByteBuffer(string: try Self.streamed(channel).body))
        let clientId = try #require(handshake.arrayValue?.first?.objectValue?["clientId"]?.stringValue)
        let connect = #"{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"long-polling","#
        try Self.post(
            #"[{"channel":"/meta/subscribe","clientId":"\#(clientId)","subscription":"/x"},"# + connect
                + #""id":"1"}]"#,
            channel)
        #expect(try Self.streamed(channel).ended)
        try Self.post(connect + #""id":"2"}"#, channel)
        #expect(try Self.streamed(channel).head == nil, "parked")
        Self.publish(9, on: "/x", shared: shared, channel: channel)
        let answered = try Self.streamed(channel)
        #expect(answered.ended)
        let replies = try JSONParser(maxDepth: 64).parse(ByteBuffer(string: answered.body)).arrayValue ?? []
        #expect(replies.first?.objectValue?["id"] == .string("2"))
        #expect(replies.last?.objectValue?["data"] == JSONValue(9))

        // A connect with a short hold is answered when it ends, with nothing waiting.
        try Self.post(connect + #""id":"3","advice":{"timeout":100}}"#, channel)
        #expect(try Self.streamed(channel).head == nil, "parked")
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(100))
        let timedOut = try Self.streamed(channel)
        #expect(timedOut.ended)
        #expect(timedOut.body.contains(#""id":"3""#))
    }
}
