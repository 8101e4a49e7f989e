import Bayeux
import NIOCore
import Testing

@testable import PubSubCore
@testable import PubSubServer

/// Drives `ConnectionStateMachine` through every path, without sockets: actions are compared as short strings.
@Suite struct ConnectionStateMachineTests {
    typealias Machine = ConnectionStateMachine

    static func event(_ n: Int) -> WireEvent {
        WireEvent(json: ByteBuffer(string: "[{\"channel\":\"/c\",\"data\":\(n)}]"))
    }

    static func events(_ range: ClosedRange<Int>) -> CircularBuffer<WireEvent> {
        CircularBuffer(range.map(event))
    }

    static func connect(_ clientId: String, id: String = "c", hold: TimeAmount = .seconds(45), attached: Bool = true)
        -> PendingConnect
    {
        PendingConnect(
            id: .string(id), clientId: clientId, advice: nil,
            result: ConnectResult(status: .ok, attached: attached, answerNow: false), hold: hold)
    }

    static func reply(_ id: String) -> Message {
        var m = Message()
        m["id"] = .string(id)
        m["successful"] = true
        return m
    }

    /// The data numbers of encoded test events.
    static func numbers(_ events: CircularBuffer<WireEvent>) -> String {
        events.map { e in
            String(
                String(buffer: e.json).drop(while: { $0 != ":" }).dropFirst().split(separator: ":").last!.dropLast(2))
        }.joined(separator: ",")
    }

    static func describe(_ answer: Machine.Answer) -> String {
        var s = "answer(\(answer.connect.reply["id"]?.stringValue ?? "?")"
        if !answer.replies.isEmpty {
            s += " replies=\(answer.replies.compactMap { $0["id"]?.stringValue }.joined(separator: ","))"
        }
        if !answer.events.isEmpty { s += " events=\(numbers(answer.events))" }
        if let failure = answer.failure { s += " fail=\(failure)" }
        if answer.takeEvents { s += " take" }
        return s + ")"
    }

    static func write(_ replies: [Message], _ events: CircularBuffer<WireEvent>) -> String {
        "write(\(replies.compactMap { $0["id"]?.stringValue ?? $0.error }.joined(separator: ","))|\(numbers(events)))"
    }

    /// The steps of an action, in the order the driver performs them.
    static func describe(_ action: Machine.Action) -> [String] {
        switch action {
        case .none: []
        case .write(let replies, let events): [write(replies, events)]
        case .answer(let answer): [describe(answer)]
        case .hold(let hold, let previous, let replies, let events):
            (previous.map { [describe($0)] } ?? []) + ["arm(\(hold.nanoseconds / 1_000_000)ms)"]
                + (replies.isEmpty && events.isEmpty ? [] : [write(replies, events)])
        case .drained(let events, let resume):
            (events.isEmpty ? [] : [write([], events)]) + (resume ? ["resumeReading"] : [])
        case .drop(let id): ["drop(\(id))"]
        case .rebind(let old, let answer): ["detach(\(old))"] + (answer.map { [describe($0)] } ?? [])
        case .close(let reason, let answer, let flush):
            (answer.map { [describe($0)] } ?? []) + (flush.isEmpty ? [] : [write([], flush)]) + ["close(\(reason))"]
        case .deliver(let events): ["deliver(\(numbers(events)))"]
        case .heartbeat: ["heartbeat"]
        case .pong(let payload): ["pong(\(String(buffer: payload)))"]
        case .abort(let reason): ["abort(\(reason.rawValue))"]
        case .fail: ["fail"]
        case .release(let id): [id.map { "release(\($0))" } ?? "release"]
        case .handle(let frame): ["handle(\(frame.bytes)\(frame.exclusive ? " exclusive" : ""))"]
        }
    }

    static func describe(_ action: Machine.DeliverAction) -> String {
        switch action {
        case .none: "none"
        case .write(let events): "write(\(numbers(events)))"
        case .answer(let answer): describe(answer)
        case .drop(let id): "drop(\(id))"
        }
    }

    // MARK: WebSocket

    @Test func webSocketHoldsTheConnectUntilItsTimerFires() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        #expect(Self.describe(m.bind(clientId: "a")) == [])
        let actions = m.messagesHandled(replies: [], events: [], pending: Self.connect("a", hold: .seconds(3)))
        #expect(Self.describe(actions) == ["arm(3000ms)"])
        #expect(m.isHolding)
        #expect(Self.describe(m.eventsDelivered(Self.events(1...1))) == "write(1)")
        #expect(m.isHolding, "a WebSocket connect is not answered by a delivery")
        #expect(Self.describe(m.holdTimerFired()) == ["answer(c)"])
        #expect(!m.isHolding)
        #expect(Self.describe(m.holdTimerFired()) == [], "a timer of an answered connect does nothing")
    }

    /// 256 events (a quarter of the queue if less) written after the held connect answer it, with those events in the same write,
    /// so that the client's next connect confirms them (`DeliveryLedger`); not while the socket is blocked.
    /// A request pipelined behind the one its connection closed on (a client killed mid-pipeline) is not handled:
    /// the machine says so instead of stopping the process.
    @Test func aRequestOnAClosedPollingConnectionIsNotStarted() {
        var m = Machine(transport: .polling, maxQueue: 10)
        let first = m.requestStarted()
        #expect(first)
        _ = m.messagesHandled(replies: [], events: [], pending: nil)
        _ = m.closed()
        let afterClose = m.requestStarted()
        #expect(!afterClose)
    }

    @Test func webSocketAnswersItsConnectOnceAQuarterOfTheQueueWentOut() {
        var m = Machine(transport: .webSocket, maxQueue: 8)
        _ = m.bind(clientId: "a")
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        #expect(Self.describe(m.eventsDelivered(Self.events(1...1))) == "write(1)")
        #expect(Self.describe(m.eventsDelivered(Self.events(2...2))) == "answer(c events=2)")
        #expect(!m.isHolding)
        #expect(Self.describe(m.eventsDelivered(Self.events(3...4))) == "write(3,4)", "no connect held: written")
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a", id: "c2"))
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.eventsDelivered(Self.events(5...6))) == "none")
        #expect(m.isHolding, "a blocked socket keeps its connect")
        // The hold's end takes what waits along, before the reply in the same write.
        #expect(Self.describe(m.holdTimerFired()) == ["answer(c2 events=5,6)"])
    }

    /// With room in the queue, a fast stream answers its held connect once `confirmInterval` passed since the last
    /// early answer (about one round trip a second, not one per 32 events), and at a quarter of the queue whatever the
    /// time, so the ledger's bound is never reached.
    @Test func webSocketAnswersAtMostEveryIntervalUnlessAQuarterOfTheQueueWentOut() {
        var m = Machine(transport: .webSocket, maxQueue: 1000)
        #expect((m.confirmEvery, m.confirmAtMost) == (32, 250))
        let t0 = NIODeadline.uptimeNanoseconds(5_000_000_000)
        _ = m.bind(clientId: "a")
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a", id: "c1"))
        #expect(Self.describe(m.eventsDelivered(Self.events(1...31), now: t0)).hasPrefix("write("))
        #expect(Self.describe(m.eventsDelivered(Self.events(32...32), now: t0)).hasPrefix("answer(c1 events=32"))
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a", id: "c2"))
        // 32 more within the interval: written, the connect still held.
        #expect(
            Self.describe(m.eventsDelivered(Self.events(33...100), now: t0 + .milliseconds(600))).hasPrefix("write("))
        #expect(m.isHolding)
        #expect(
            Self.describe(m.eventsDelivered(Self.events(101...101), now: t0 + .seconds(1))).hasPrefix(
                "answer(c2 events=101"))
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a", id: "c3"))
        // A quarter of the queue within the interval: answered anyway.
        #expect(
            Self.describe(m.eventsDelivered(Self.events(102...350), now: t0 + .milliseconds(1010))).hasPrefix("write("))
        #expect(
            Self.describe(m.eventsDelivered(Self.events(351...351), now: t0 + .milliseconds(1010))).hasPrefix(
                "answer(c3 events=351"))
    }

    @Test func webSocketNewerConnectSupersedesTheHeldOne() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a", id: "c1"))
        let actions = m.messagesHandled(
            replies: [Self.reply("s")], events: Self.events(1...1),
            pending: Self.connect("a", id: "c2", hold: .seconds(1)))
        #expect(Self.describe(actions) == ["answer(c1)", "arm(1000ms)", "write(s|1)"])
    }

    @Test func webSocketRebindDetachesTheOldClientAndAnswersItsConnect() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        #expect(Self.describe(m.bind(clientId: "b")) == ["detach(a)", "answer(c)"])
        #expect(m.clientId == "b")
        #expect(Self.describe(m.bind(clientId: "b")) == [])
    }

    @Test func unwritableSocketBacklogsEventsWithholdsReadsAndFlushesWhenWritable() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        #expect(m.readRequested() == .read)
        #expect(Self.describe(m.writabilityChanged(isWritable: false)) == [])
        #expect(m.readRequested() == .withhold)
        #expect(Self.describe(m.eventsDelivered(Self.events(1...2))) == "none")
        #expect(Self.describe(m.eventsDelivered(Self.events(3...3))) == "none")
        #expect(m.backlog.count == 3)
        // Replies still go, with what waits, in order.
        let actions = m.messagesHandled(replies: [Self.reply("p")], events: Self.events(4...4), pending: nil)
        #expect(Self.describe(actions) == ["write(p|1,2,3,4)"])
        #expect(Self.describe(m.eventsDelivered(Self.events(5...5))) == "none")
        #expect(Self.describe(m.writabilityChanged(isWritable: true)) == ["write(|5)", "resumeReading"])
        #expect(m.backlog.isEmpty)
        #expect(m.readRequested() == .read)
        // Writable again without a withheld read: nothing to resume.
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.writabilityChanged(isWritable: true)) == [])
    }

    static func frame(_ bytes: Int32 = 10, exclusive: Bool = true) -> FramesInFlight.Frame {
        FramesInFlight.Frame(elements: [], bytes: bytes, exclusive: exclusive)
    }

    /// An exclusive frame (a meta message: its publishes may wait for a Redis round trip) is the only one with
    /// the broker, and reading waits with it; the read withheld is asked for when the frame is answered, unless
    /// writes still drain.
    @Test func anExclusiveFrameHoldsReadingUntilItIsAnswered() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        #expect(m.frameArrived(Self.frame()) != nil)
        #expect(!m.takesFrames)
        #expect(m.readRequested() == .withhold)
        #expect(Self.describe(m.frameFinished(bytes: 10)) == ["resumeReading"])
        #expect(m.takesFrames && m.readRequested() == .read)
        // Answered at once (no read asked meanwhile): nothing to resume.
        #expect(m.frameArrived(Self.frame()) != nil)
        #expect(Self.describe(m.frameFinished(bytes: 10)) == [])
        // Not writable when the frame is done: the read waits for the writes to drain, and only then.
        #expect(m.frameArrived(Self.frame()) != nil)
        #expect(m.readRequested() == .withhold)
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.frameFinished(bytes: 10)) == [])
        #expect(Self.describe(m.writabilityChanged(isWritable: true)) == ["resumeReading"])
        // Writable again while a frame is still handled: the read waits for the frame.
        #expect(m.frameArrived(Self.frame()) != nil)
        _ = m.writabilityChanged(isWritable: false)
        #expect(m.readRequested() == .withhold)
        #expect(Self.describe(m.writabilityChanged(isWritable: true)) == [])
        #expect(Self.describe(m.frameFinished(bytes: 10)) == ["resumeReading"])
    }

    /// Frames of publishes follow one another to the broker without waiting for answers (a Redis round trip
    /// each), up to `maxCount` of them, and reading goes on meanwhile.
    @Test func framesOfPublishesGoToTheBrokerWithoutWaitingForAnswers() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        for n in 1...Int(FramesInFlight.maxCount) {
            #expect(m.takesFrames, "frame \(n)")
            #expect(m.readRequested() == .read)
            #expect(m.frameArrived(Self.frame(exclusive: false)) != nil, "frame \(n)")
        }
        #expect(!m.takesFrames, "at most \(FramesInFlight.maxCount) in flight")
        #expect(m.readRequested() == .withhold)
        #expect(Self.describe(m.frameFinished(bytes: 10)) == ["resumeReading"])
        #expect(m.takesFrames)
        for _ in 1..<Int(FramesInFlight.maxCount) { _ = m.frameFinished(bytes: 10) }
        #expect(m.frames.isEmpty && m.frames.bytes == 0)
    }

    /// A frame with a meta message waits for the frames of publishes before it, and no frame is taken after it
    /// until it is answered: what a subscribe or connect does comes after the publishes before it and before
    /// those after it.
    @Test func anExclusiveFrameWaitsForTheFramesBeforeIt() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        #expect(m.frameArrived(Self.frame(1, exclusive: false)) != nil)
        #expect(m.frameArrived(Self.frame(2, exclusive: false)) != nil)
        #expect(m.frameArrived(Self.frame(3)) == nil, "held")
        #expect(!m.takesFrames && m.readRequested() == .withhold)
        #expect(Self.describe(m.frameFinished(bytes: 1)) == [])
        #expect(Self.describe(m.frameFinished(bytes: 2)) == ["handle(3 exclusive)"])
        #expect(!m.takesFrames, "nothing is taken while it is with the broker")
        #expect(Self.describe(m.frameFinished(bytes: 3)) == ["resumeReading"])
        #expect(m.takesFrames)
        // A frame of publishes behind an exclusive one waits for its answer too.
        #expect(m.frameArrived(Self.frame(4)) != nil)
        #expect(!m.takesFrames)
        #expect(m.frames.held == nil)
        _ = m.frameFinished(bytes: 4)
        #expect(m.frameArrived(Self.frame(5, exclusive: false)) != nil)
    }

    /// Frames in flight hold at most `maxFrameBytes` together: a frame that would exceed it waits, and none is
    /// taken once they reach it; a frame larger than the bound alone still goes, alone.
    @Test func framesInFlightAreBoundedInBytes() {
        var m = Machine(transport: .webSocket, maxQueue: 10, maxFrameBytes: 100)
        _ = m.bind(clientId: "a")
        #expect(m.frameArrived(Self.frame(60, exclusive: false)) != nil)
        #expect(m.takesFrames)
        #expect(m.frameArrived(Self.frame(50, exclusive: false)) == nil, "60 + 50 is over 100")
        #expect(!m.takesFrames)
        #expect(Self.describe(m.frameFinished(bytes: 60)) == ["handle(50)"])
        #expect(m.frameArrived(Self.frame(50, exclusive: false)) != nil, "50 + 50 fits")
        #expect(!m.takesFrames, "100 in flight: none is taken")
        _ = m.frameFinished(bytes: 50)
        _ = m.frameFinished(bytes: 50)
        #expect(m.frameArrived(Self.frame(500, exclusive: false)) != nil, "alone, any frame goes")
        #expect(!m.takesFrames)
        _ = m.frameFinished(bytes: 500)
        #expect(m.frames.isEmpty && m.frames.bytes == 0 && m.takesFrames)
    }

    /// A session that ends while frames of publishes are with the broker closes once they are all answered;
    /// the frame held behind them is dropped.
    @Test func aSessionEndedDuringFramesInFlightClosesAfterTheLast() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        #expect(m.frameArrived(Self.frame(1, exclusive: false)) != nil)
        #expect(m.frameArrived(Self.frame(2, exclusive: false)) != nil)
        #expect(m.frameArrived(Self.frame(3)) == nil)
        #expect(Self.describe(m.detached(.kicked)) == [])
        #expect(Self.describe(m.frameFinished(bytes: 1)) == [])
        #expect(m.isOpen)
        #expect(Self.describe(m.frameFinished(bytes: 2)) == ["close(normal)"])
        #expect(!m.isOpen && m.frames.held == nil)
        // A connection closed with a frame held: once the frames before it are answered, it is dropped unhandled.
        var c = Machine(transport: .webSocket, maxQueue: 10)
        _ = c.bind(clientId: "a")
        #expect(c.frameArrived(Self.frame(1, exclusive: false)) != nil)
        #expect(c.frameArrived(Self.frame(2)) == nil)
        _ = c.closeNow(.peerClosed(code: 1000))
        #expect(Self.describe(c.frameFinished(bytes: 1)) == [])
        #expect(c.frames.held == nil && c.frames.isEmpty)
    }

    /// A session that ends while its frame is handled (a `/meta/disconnect` on an engine that answers after it
    /// detaches, as Redis does): the frame's reply is written, then the socket closes; not before.
    @Test func aSessionEndedDuringItsFrameClosesAfterTheFramesReplies() {
        for reason in [DetachReason.disconnected, .kicked, .expired] {
            var m = Machine(transport: .webSocket, maxQueue: 10)
            _ = m.bind(clientId: "a")
            #expect(m.frameArrived(Self.frame()) != nil)
            #expect(Self.describe(m.detached(reason)) == [], "\(reason)")
            #expect(m.isOpen)
            #expect(
                Self.describe(m.messagesHandled(replies: [Self.reply("d")], events: .noEvents, pending: nil)) == [
                    "write(d|)"
                ])
            #expect(Self.describe(m.frameFinished(bytes: 10)) == ["close(normal)"])
            #expect(!m.isOpen)
        }
        // Outside a frame it closes at once, as before.
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        #expect(Self.describe(m.detached(.disconnected)) == ["close(normal)"])
    }

    @Test func eventsOnlyFrameWhileUnwritableWaitsInTheBacklog() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.messagesHandled(replies: [], events: Self.events(1...2), pending: nil)) == [])
        #expect(m.backlog.count == 2)
    }

    @Test func slowConsumerIsDroppedPastMaxQueue() {
        var m = Machine(transport: .webSocket, maxQueue: 3)
        _ = m.bind(clientId: "a")
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.eventsDelivered(Self.events(1...3))) == "none")
        #expect(Self.describe(m.eventsDelivered(Self.events(4...4))) == "drop(a)")
        #expect(m.backlog.isEmpty)
        #expect(!m.isOpen)
        #expect(Self.describe(m.eventsDelivered(Self.events(5...5))) == "none")
        #expect(Self.describe(m.writabilityChanged(isWritable: true)) == [])
        // The dropped session's sink is gone with it: nothing to detach when the socket closes.
        #expect(Self.describe(m.closed()) == ["release"])
    }

    @Test func dropFromAFrameOfEvents() {
        var m = Machine(transport: .webSocket, maxQueue: 1)
        _ = m.bind(clientId: "a")
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.messagesHandled(replies: [], events: Self.events(1...2), pending: nil)) == ["drop(a)"])
    }

    @Test func webSocketDetachReasons() {
        func held() -> Machine {
            var m = Machine(transport: .webSocket, maxQueue: 10)
            _ = m.bind(clientId: "a")
            _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
            return m
        }
        var m = held()
        #expect(Self.describe(m.detached(.superseded)) == ["answer(c)"])
        #expect(m.isOpen && m.clientId == nil)
        m = held()
        #expect(Self.describe(m.detached(.overflow)) == ["answer(c fail=409:a:Queue overflow)"])
        #expect(m.isOpen, "the socket stays: the client handshakes again on it")
        m = held()
        #expect(Self.describe(m.detached(.disconnected)) == ["answer(c)", "close(normal)"])
        #expect(Self.describe(m.messagesHandled(replies: [Self.reply("x")], events: [], pending: nil)) == [])
        m = held()
        #expect(Self.describe(m.detached(.expired)) == ["answer(c)", "close(normal)"])
        m = held()
        _ = m.writabilityChanged(isWritable: false)
        _ = m.eventsDelivered(Self.events(1...1))
        #expect(Self.describe(m.detached(.shutdown)) == ["answer(c)", "write(|1)", "close(goingAway)"])
    }

    @Test func webSocketQuiesceAnswersSendsWhatWaitsAndCloses() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        _ = m.writabilityChanged(isWritable: false)
        _ = m.eventsDelivered(Self.events(1...2))
        #expect(Self.describe(m.quiesce()) == ["answer(c)", "write(|1,2)", "close(goingAway)"])
        #expect(Self.describe(m.quiesce()) == [])
        #expect(Self.describe(m.detached(.shutdown)) == [])
        #expect(Self.describe(m.closed()) == ["release(a)"])
        #expect(Self.describe(m.closed()) == [])
    }

    @Test func closedSocketCancelsTheTimerAndDetaches() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        #expect(Self.describe(m.closed()) == ["release(a)"])
        #expect(Self.describe(m.holdTimerFired()) == [])
        #expect(Self.describe(m.eventsDelivered(Self.events(1...1))) == "none")
    }

    /// The handler closes on its own (a close frame received, a protocol error): its close frame goes out once,
    /// and nothing after it; the session stays attached until the connection is gone.
    @Test func closingStopsWrites() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        #expect(!m.closeSent)
        let sent = m.sendingClose()
        #expect(sent)
        #expect(m.closeSent)
        #expect(!m.isOpen)
        let sentAgain = m.sendingClose()
        #expect(!sentAgain, "the close frame goes out once")
        #expect(Self.describe(m.eventsDelivered(Self.events(1...1))) == "none")
        #expect(Self.describe(m.messagesHandled(replies: [Self.reply("x")], events: [], pending: nil)) == [])
        #expect(Self.describe(m.requestFailed(CancellationError())) == [], "a closing socket answers nothing")
        #expect(Self.describe(m.closed()) == ["release(a)"])
        #expect(m.closeSent)
        let sentWhenGone = m.sendingClose()
        #expect(!sentWhenGone, "nothing is written once the connection is gone")
    }

    /// The peer closed, or broke the protocol: the close goes out at once, before anything the machine holds (the
    /// held connect, events waiting for the socket), once; pings and frames answered at once stop with it.
    @Test func aCloseFromThePeerOrAProtocolErrorGoesOutAtOnce() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        _ = m.writabilityChanged(isWritable: false)
        _ = m.eventsDelivered(Self.events(1...2))
        #expect(Self.describe(m.pingReceived(ByteBuffer(string: "hi"))) == ["pong(hi)"])
        #expect(Self.describe(m.answeredAtOnce([Self.reply("bad")])) == ["write(bad|)"])
        #expect(Self.describe(m.closeNow(.peerClosed(code: 1000))) == ["close(peerClosed(code: Optional(1000)))"])
        #expect(!m.isOpen && !m.closeSent)
        let sent = m.sendingClose()
        #expect(sent)
        #expect(Self.describe(m.closeNow(.protocolError)) == [], "the close frame went out already")
        #expect(Self.describe(m.pingReceived(ByteBuffer(string: "hi"))) == [])
        #expect(Self.describe(m.answeredAtOnce([])) == [])
        #expect(Self.describe(m.closed()) == ["release(a)"], "the held connect ends unanswered")
    }

    /// Before any connect bound the socket, a protocol error closes it as well, and nothing is released.
    @Test func aProtocolErrorBeforeTheFirstConnectCloses() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        #expect(Self.describe(m.closeNow(.invalidData)) == ["close(invalidData)"])
        let sent = m.sendingClose()
        #expect(sent && m.closeSent)
        #expect(Self.describe(m.closed()) == ["release"])
    }

    /// A close the machine asks for (here: the server drains) is closing, but not yet sent: the answer and what
    /// waited go out first, then the close frame, once.
    @Test func aCloseAskedForIsSentAfterWhatItFlushes() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        _ = m.writabilityChanged(isWritable: false)
        _ = m.eventsDelivered(Self.events(1...2))
        #expect(Self.describe(m.quiesce()) == ["answer(c)", "write(|1,2)", "close(goingAway)"])
        #expect(!m.isOpen)
        #expect(!m.closeSent, "the answer and what waited still go out")
        let sent = m.sendingClose()
        #expect(sent)
        #expect(m.closeSent)
        let sentAgain = m.sendingClose()
        #expect(!sentAgain)
        #expect(Self.describe(m.closed()) == ["release(a)"])
    }

    @Test func aDropClosesAfterTheDrop() {
        var m = Machine(transport: .webSocket, maxQueue: 2)
        _ = m.bind(clientId: "a")
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.eventsDelivered(Self.events(1...3))) == "drop(a)")
        #expect(!m.closeSent)
        let sent = m.sendingClose()
        #expect(sent)
        #expect(Self.describe(m.closed()) == ["release"])
    }

    // MARK: Keep-alive

    static let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)

    static func at(_ seconds: Int64, ms: Int64 = 0) -> NIODeadline { t0 + .seconds(seconds) + .milliseconds(ms) }

    static func guardState(send: TimeAmount = .seconds(30), ping: TimeAmount = .seconds(10)) -> ConnectionGuardState {
        ConnectionGuardState(timeouts: ConnectionTimeouts(send: send), pingInterval: ping, now: t0)
    }

    @Test func webSocketKeepAlivePingsASilentPeerThenAbortsIt() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        #expect(m.keepAlive.deadline == nil)
        #expect(!m.keepAlive.watchesUnsentBytes, "nothing is timed before the guard hands over")
        m.keepAliveHandedOver(Self.guardState(), unsentBytes: 0, now: Self.at(0))
        #expect(m.keepAlive.watchesUnsentBytes)
        #expect(m.keepAlive.deadline == Self.at(10))
        m.bytesReceived(5, now: Self.at(4))
        #expect(m.keepAlive.deadline == Self.at(14), "any byte is a sign of life")
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(10))) == [], "an entry that comes early does nothing")
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(14))) == ["heartbeat"])
        #expect(m.keepAlive.deadline == Self.at(24))
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(24))) == ["abort(no answer to pings)"])
    }

    @Test func webSocketKeepAliveDoesNotPingAClosingSocketAndStopsWhenClosed() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        m.keepAliveHandedOver(Self.guardState(), unsentBytes: 0, now: Self.at(0))
        _ = m.sendingClose()
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(10))) == [])
        _ = m.closed()
        #expect(m.keepAlive.deadline == nil)
        #expect(!m.keepAlive.watchesUnsentBytes)
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(30))) == [])
    }

    /// Writes that stay blocked, or bytes the socket does not take while the channel stays writable, end in the
    /// send timeout; bytes that go out in the meantime give a slow reader another one.
    @Test func webSocketKeepAliveAbortsAReaderThatStopped() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        m.keepAliveHandedOver(Self.guardState(send: .seconds(5), ping: .seconds(60)), unsentBytes: 0, now: Self.at(0))
        let checked = m.unsentCheckDue(now: Self.at(1))
        #expect(checked)
        let checkedSoonAfter = m.unsentCheckDue(now: Self.at(1, ms: 10))
        #expect(!checkedSoonAfter, "looked at no more often than every 50 ms")
        m.unsentWritten(100, now: Self.at(1))
        #expect(m.keepAlive.deadline == Self.at(6))
        let checkedWhileBlocked = m.unsentCheckDue(now: Self.at(2))
        #expect(!checkedWhileBlocked, "the send timeout runs already")
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(6), unsentBytes: 60)) == [], "some went out")
        #expect(m.keepAlive.deadline == Self.at(11))
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(11), unsentBytes: 60)) == ["abort(send timeout)"])

        var n = Machine(transport: .webSocket, maxQueue: 10)
        n.keepAliveHandedOver(Self.guardState(send: .seconds(5), ping: .seconds(60)), unsentBytes: 0, now: Self.at(0))
        _ = n.writabilityChanged(isWritable: false, unsentBytes: 500, now: Self.at(1))
        #expect(n.keepAlive.deadline == Self.at(6))
        _ = n.writabilityChanged(isWritable: true, unsentBytes: 0, now: Self.at(2))
        #expect(n.keepAlive.deadline == Self.at(60), "writable again: only the ping is due")
    }

    // MARK: Polling

    @Test func pollingAnswersWithTheFirstDelivery() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        let actions = m.messagesHandled(replies: [], events: [], pending: Self.connect("a", hold: .seconds(2)))
        #expect(Self.describe(actions) == ["arm(2000ms)"])
        #expect(Self.describe(m.eventsDelivered(Self.events(1...2))) == "answer(c events=1,2)")
        #expect(!m.isHolding)
        #expect(Self.describe(m.holdTimerFired()) == [])
    }

    @Test func pollingHoldEndTakesWhatTheSessionHolds() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        #expect(Self.describe(m.holdTimerFired()) == ["answer(c take)"])
    }

    @Test func pollingWithoutHeldConnectWritesAtOnce() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        let actions = m.messagesHandled(replies: [Self.reply("h")], events: Self.events(1...1), pending: nil)
        #expect(Self.describe(actions) == ["write(h|1)"])
        #expect(!m.isHolding)
        // A connect that was not attached is not held either.
        _ = m.requestStarted()
        let unattached = m.messagesHandled(replies: [], events: [], pending: Self.connect("a", attached: false))
        #expect(Self.describe(unattached) == ["write(|)"])
    }

    @Test func pollingDeliveryBeforeParkingAnswersAtOnce() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        #expect(Self.describe(m.eventsDelivered(Self.events(1...1))) == "none")
        let actions = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        #expect(Self.describe(actions) == ["answer(c events=1)"])
    }

    /// A request the broker failed on (a 500) leaves nothing parked: the connection's next request is handled.
    @Test func pollingAfterAFailedRequestTakesTheNextOne() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        #expect(Self.describe(m.requestFailed(CancellationError())) == ["fail"])
        _ = m.requestStarted()
        #expect(
            Self.describe(m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))) == ["arm(45000ms)"])
    }

    @Test func pollingDetachBeforeParkingAnswersAtOnce() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        #expect(Self.describe(m.detached(.overflow)) == [])
        let actions = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        #expect(Self.describe(actions) == ["answer(c fail=409:a:Queue overflow)"])
        // The next request starts clean.
        _ = m.requestStarted()
        #expect(
            Self.describe(m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))) == ["arm(45000ms)"])
    }

    @Test func pollingDetachReasons() {
        for (reason, expected) in [
            (DetachReason.overflow, "answer(c fail=409:a:Queue overflow)"), (.superseded, "answer(c)"),
            (.shutdown, "answer(c)"), (.disconnected, "answer(c)"), (.expired, "answer(c)"),
        ] {
            var m = Machine(transport: .polling, maxQueue: 10)
            _ = m.requestStarted()
            _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
            #expect(Self.describe(m.detached(reason)) == [expected], "\(reason)")
            #expect(m.isOpen, "a polling connection goes on after its answer")
        }
    }

    @Test func pollingQuiesceReleasesTheParkedConnectAndAnyLaterOne() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        #expect(Self.describe(m.quiesce()) == ["answer(c take)"])
        _ = m.requestStarted()
        #expect(
            Self.describe(m.messagesHandled(replies: [], events: [], pending: Self.connect("a", id: "c2")))
                == ["answer(c2 take)"])
    }

    @Test func pollingClosedWhileParkedDetaches() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        #expect(Self.describe(m.closed()) == ["release(a)"])
    }

    @Test func pollingNeverBacklogsOrDropsWhileUnwritable() {
        var m = Machine(transport: .polling, maxQueue: 1)
        _ = m.writabilityChanged(isWritable: false)
        #expect(m.readRequested() == .withhold)
        _ = m.requestStarted()
        _ = m.messagesHandled(replies: [], events: [], pending: Self.connect("a"))
        #expect(Self.describe(m.eventsDelivered(Self.events(1...5))) == "answer(c events=1,2,3,4,5)")
        #expect(Self.describe(m.writabilityChanged(isWritable: true)) == ["resumeReading"])
    }

    // MARK: EventSource

    @Test func eventSourceWritesHeartbeatsOnlyWhileStreamingAndWritable() {
        var m = Machine(transport: .polling, maxQueue: 10)
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(0))) == [])
        #expect(m.keepAlive.deadline == nil)
        m.streamOpened(clientId: "a", heartbeat: .seconds(1), now: Self.at(0))
        #expect(m.keepAlive.deadline == Self.at(1))
        #expect(!m.keepAlive.watchesUnsentBytes)
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(0, ms: 500))) == [], "not due yet")
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(1))) == ["heartbeat"])
        #expect(m.keepAlive.deadline == Self.at(2))
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(2))) == [])
        #expect(m.keepAlive.deadline == Self.at(3), "the next one is still due")
        _ = m.writabilityChanged(isWritable: true)
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(3))) == ["heartbeat"])
        _ = m.detached(.disconnected)
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(4))) == [])
        #expect(m.keepAlive.deadline == nil, "a stream that ended has no heartbeats")
    }

    @Test func eventSourceWithoutAnIntervalHasNoHeartbeats() {
        var m = Machine(transport: .polling, maxQueue: 10)
        m.streamOpened(clientId: "a", heartbeat: .zero, now: Self.at(0))
        #expect(m.keepAlive.deadline == nil)
    }

    @Test func eventSourceBacklogsAndDropsLikeAWebSocket() {
        var m = Machine(transport: .polling, maxQueue: 2)
        m.streamOpened(clientId: "a")
        #expect(Self.describe(m.eventsDelivered(Self.events(1...1))) == "write(1)")
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.eventsDelivered(Self.events(2...3))) == "none")
        #expect(Self.describe(m.writabilityChanged(isWritable: true)) == ["write(|2,3)"])
        _ = m.writabilityChanged(isWritable: false)
        #expect(Self.describe(m.eventsDelivered(Self.events(4...6))) == "drop(a)")
        #expect(Self.describe(m.keepAliveTimerFired(now: Self.at(100))) == [])
    }

    @Test func eventSourceEndsOnAnyDetach() {
        var m = Machine(transport: .polling, maxQueue: 10)
        m.streamOpened(clientId: "a")
        #expect(Self.describe(m.detached(.superseded)) == ["close(normal)"])
        m = Machine(transport: .polling, maxQueue: 10)
        m.streamOpened(clientId: "a")
        _ = m.writabilityChanged(isWritable: false)
        _ = m.eventsDelivered(Self.events(1...1))
        #expect(Self.describe(m.detached(.shutdown)) == ["write(|1)", "close(goingAway)"])
        #expect(Self.describe(m.closed()) == ["release"])
    }

    @Test func eventSourceQuiesceAndClose() {
        var m = Machine(transport: .polling, maxQueue: 10)
        m.streamOpened(clientId: "a")
        #expect(Self.describe(m.quiesce()) == ["close(goingAway)"])
        var n = Machine(transport: .polling, maxQueue: 10)
        n.streamOpened(clientId: "a")
        #expect(Self.describe(n.closed()) == ["release(a)"])
    }
}
