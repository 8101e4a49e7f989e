import Bayeux
import NIOCore
import NIOEmbedded
import Testing

@testable import PubSubCore
@testable import PubSubServer

/// The `ConnectionDriver` with a transport that records what it is asked to do: sinks by generation, the one
/// timer entry per connection, and a driver and handler that free each other.
@Suite struct ConnectionDriverTests {
    final class RecordingTransport: ConnectionTransport {
        var calls: [String] = []
        func send(replies: [Message], events: CircularBuffer<WireEvent>) {
            calls.append("send(\(replies.count) replies, \(events.count) events)")
        }
        func sendHeartbeat() { calls.append("heartbeat") }
        func close(_ reason: ConnectionStateMachine.CloseReason) { calls.append("close(\(reason))") }
        func resumeReading() { calls.append("resumeReading") }
        func requestFailed(_ error: any Error) { calls.append("failed") }
    }

    static func message(_ json: String) throws -> [MessageBatch.Element] {
        try #require(MessageBatch.elements(of: try JSONParser(maxDepth: 64).parse(Array(json.utf8))))
    }

    static func polling(_ shared: ServerShared, _ loop: EmbeddedEventLoop) -> (ConnectionDriver, RecordingTransport) {
        let transport = RecordingTransport()
        let driver = ConnectionDriver(
            transport: transport, context: RequestContext(connectionType: .longPolling), shared: shared, eventLoop: loop
        )
        return (driver, transport)
    }

    static func connect(_ clientId: String) throws -> [MessageBatch.Element] {
        try message(#"{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"long-polling"}"#)
    }

    /// A parked connect answered by a delivery lets its sink go: what that sink is still handed (an engine's
    /// late call) reaches nobody, and the next request's sink is another generation.
    @Test func aSinkLetGoChangesNothing() async throws {
        let loop = EmbeddedEventLoop()
        let shared = ConnectionHandlerTests.makeShared(maxQueue: 10, recorder: .init())
        let (driver, transport) = Self.polling(shared, loop)
        let clientId = try await shared.broker.engine.createClient(now: .now(), on: loop).get()
        _ = try await shared.broker.engine.subscribe(clientId, to: ["/x"], resume: nil, now: .now(), on: loop).get()
        driver.handle(try Self.connect(clientId), context: RequestContext(connectionType: .longPolling))
        loop.run()
        #expect(transport.calls == ["send(1 replies, 0 events)"], "a session's first connect is answered at once")
        driver.handle(try Self.connect(clientId), context: RequestContext(connectionType: .longPolling))
        loop.run()
        let parked = try #require(driver.currentSink)
        #expect(transport.calls.count == 1, "the second connect is parked")
        ConnectionHandlerTests.publish(1, on: "/x", shared: shared, loop: loop)
        #expect(transport.calls.last == "send(1 replies, 1 events)")
        #expect(driver.currentSink == nil)
        parked.deliver(CircularBuffer([WireEvent(json: ByteBuffer(string: "[{}]"))]))
        parked.detached(.overflow)
        #expect(transport.calls.count == 2, "the answered connect's sink is not heard")
        driver.handle(try Self.connect(clientId), context: RequestContext(connectionType: .longPolling))
        loop.run()
        let next = try #require(driver.currentSink)
        #expect(next.generation != parked.generation)
        driver.closed()
        #expect(driver.currentSink == nil)
        try await loop.shutdownGracefully()
    }

    /// EventSource heartbeats are the driver's entry in the loop's timers, not a scheduled task per stream.
    @Test func streamHeartbeatsComeFromTheLoopTimers() async throws {
        let loop = EmbeddedEventLoop()
        let shared = ConnectionHandlerTests.makeShared(maxQueue: 10, pingInterval: .seconds(5), recorder: .init())
        let (driver, transport) = Self.polling(shared, loop)
        let clientId = try await shared.broker.engine.createClient(now: .now(), on: loop).get()
        driver.openStream(clientId: clientId)
        loop.run()
        loop.advanceTime(by: .seconds(5))
        #expect(transport.calls == ["heartbeat"])
        loop.advanceTime(by: .seconds(5))
        #expect(transport.calls == ["heartbeat", "heartbeat"])
        driver.closed()
        loop.advanceTime(by: .seconds(5))
        #expect(transport.calls == ["heartbeat", "heartbeat"], "nothing after the connection is gone")
        try await loop.shutdownGracefully()
    }

    /// The handler owns its driver, the driver's sink is held by the engine: once the socket closes, the sink
    /// lets go of the session and nothing keeps the handler or the driver.
    @Test func handlerAndDriverAreFreedWhenTheSocketCloses() throws {
        weak var handler: WebSocketHandler?
        weak var driver: ConnectionDriver?
        weak var sink: ConnectionSink?
        let shared = ConnectionHandlerTests.makeShared(maxQueue: 10, recorder: .init())
        do {
            let (channel, _, _, _) = try ConnectionHandlerTests.webSocket(shared: shared)
            let strong = try channel.pipeline.syncOperations.handler(type: WebSocketHandler.self)
            handler = strong
            driver = strong.driver
            sink = strong.driver.currentSink
            #expect(sink != nil, "the socket's client is bound")
            _ = try channel.finish()
        }
        #expect(handler == nil)
        #expect(driver == nil)
        #expect(sink == nil)
    }

    // MARK: Impossible transitions stop

    @Test func aSecondRequestWhileOneIsParkedStops() async {
        await #expect(processExitsWith: .failure) {
            var machine = ConnectionStateMachine(transport: .polling, maxQueue: 1)
            _ = machine.requestStarted()
            _ = machine.requestStarted()
        }
    }

    @Test func aFrameOnAPollingConnectionStops() async {
        await #expect(processExitsWith: .failure) {
            var machine = ConnectionStateMachine(transport: .polling, maxQueue: 1)
            _ = machine.frameArrived(FramesInFlight.Frame(elements: [], bytes: 0, exclusive: true))
        }
    }

    @Test func aDeliveryToAnIdlePollingConnectionStops() async {
        await #expect(processExitsWith: .failure) {
            var machine = ConnectionStateMachine(transport: .polling, maxQueue: 1)
            _ = machine.eventsDelivered(CircularBuffer([WireEvent(json: ByteBuffer(string: "[{}]"))]))
        }
    }

    @Test func aStreamOpenedOnAWebSocketStops() async {
        await #expect(processExitsWith: .failure) {
            var machine = ConnectionStateMachine(transport: .webSocket, maxQueue: 1)
            machine.streamOpened(clientId: "a")
        }
    }
}
