import Atomics
import Bayeux
import Histogram
import NIOCore

/// The byte pipe under a client: one WebSocket, or one HTTP/1.1 keep-alive connection (long-polling).
protocol BenchWire: AnyObject {
    func send(_ body: ByteBuffer)
    /// Sends the message `prefix` + `id` + `"}]` (a `/meta/connect`, whose id alone changes).
    func send(prefix: [UInt8], id: Int)
    func close()
}

extension BenchWire {
    func send(prefix: [UInt8], id: Int) {
        var body = ByteBuffer()
        body.reserveCapacity(prefix.count + 24)
        body.writeBytes(prefix)
        body.writeDecimal(id)
        body.writeStaticString("\"}]")
        send(body)
    }
}

/// One Bayeux client of the load: a subscriber (handshake, subscribe, then `/meta/connect` for ever) or a
/// publisher (handshake, unless it posts like a Rails app, then publishes). Lives on one event loop and is only
/// touched there; it counts into that loop's `LoopStats`.
// @unchecked: loop-bound without `NIOLoopBound`: a client lives on one event loop and is only touched there (the
// load generator's hot path).
final class BenchClient: @unchecked Sendable {
    enum Role {
        case subscriber(slot: Int)
        case publisher(index: Int)
    }

    let role: Role
    let shared: RunShared
    let stats: LoopStats
    let loop: any EventLoop
    /// The endpoint this client connects to, and the local address it binds first (nil: the system's choice).
    let target: BenchURL
    let source: String?
    let ready: EventLoopPromise<Void>
    private(set) var wire: (any BenchWire)?
    private var clientId: String?
    private var readyDone = false
    private var startedAt: UInt64 = 0
    private var nextMessageId = 0
    private(set) var closed = false
    /// Centrifuge: the connect command's reply is awaited, then this many subscribe replies.
    var centrifugeConnecting = false
    var centrifugeSubscribesPending = 0
    private var timeout: Scheduled<Void>?

    // Subscriber state: the next sequence expected per (publisher, channel).
    private var nextSequence: [UInt32] = []
    private var pendingReceipts = 0

    // Publisher state.
    private var plan: PublishPlan?
    private var sequences: [UInt32] = []
    private var messagesSent = 0
    private var messagesInWindow = 0
    private var unacked = 0
    /// One slot to start with: NIO's default of 16 (256 bytes) would be held by every subscriber, which never
    /// publishes; a publisher's ring grows by doubling.
    private var sendTimes = CircularBuffer<(sentAt: UInt64, remaining: Int)>(initialCapacity: 1)
    private var publishing = false
    private var nextDue: UInt64 = 0
    private var frameTimer: Scheduled<Void>?
    private var retryTimer: Scheduled<Void>?
    private var done: EventLoopPromise<Void>?
    private var clientIdBytes: [UInt8] = []
    /// `[{"channel":"/meta/connect",…,"id":"` for this client, set at the handshake.
    private var connectPrefix: [UInt8] = []
    private lazy var roomChoice = SplitMix64(seed: 0x5EED_0000 &+ UInt64(publisherIndex))

    init(role: Role, shared: RunShared, stats: LoopStats, loop: any EventLoop, index: Int) {
        self.role = role
        self.shared = shared
        self.stats = stats
        self.loop = loop
        (self.target, self.source) = shared.options.endpoint(index)
        self.ready = loop.makePromise()
        if case .subscriber = role {
            nextSequence = Array(repeating: 0, count: max(1, shared.options.publishers) * shared.channels.count)
        } else {
            sequences = Array(repeating: 0, count: shared.channels.count)
        }
    }

    var isSubscriber: Bool {
        if case .subscriber = role { return true }
        return false
    }

    private var publisherIndex: Int {
        if case .publisher(let i) = role { return i }
        return 0
    }

    /// Opens the connection; `ready` completes once the client is handshaken and subscribed (or, for a
    /// publisher, handshaken).
    func start() {
        loop.preconditionInEventLoop()
        startedAt = monotonicNanoseconds()
        let limit = TimeAmount.nanoseconds(Int64(shared.options.connectTimeout * 1e9))
        timeout = loop.scheduleTask(in: limit) { [self] in
            self.fail("not ready within \(shared.options.connectTimeout) s")
        }
        let connecting: EventLoopFuture<any NIOCore.Channel>
        switch shared.options.transport {
        case .websocket: connecting = WebSocketWire.connect(self)
        case .longPolling: connecting = LongPollWire.connect(self)
        }
        connecting.whenFailure { [self] (error: any Error) in self.fail("connect: \(error)") }
    }

    // MARK: Wire events

    func wireReady(_ wire: any BenchWire) {
        self.wire = wire
        if closed {
            wire.close()
            return
        }
        if case .publisher = role, shared.options.scenario == .publish {
            becomeReady()
            return
        }
        switch shared.options.serverProtocol {
        case .bayeux: sendHandshake()
        case .centrifuge: sendCentrifugeConnect()
        }
    }

    func wireFailed(_ reason: String) {
        if !readyDone {
            fail(reason)
        } else if !closed {
            stats.recordError(reason)
        }
    }

    func wireClosed() {
        guard !closed else { return }
        wireFailed("connection closed by the server")
        closed = true
        stopPublishing()
    }

    /// Everything the server sent in one frame or HTTP response.
    func received(_ body: ByteBuffer) {
        let now = monotonicNanoseconds()
        if shared.options.serverProtocol == .centrifuge {
            receivedCentrifuge(body, now: now)
            return
        }
        var others: [[UInt8]] = []
        var connectSucceeded = false
        let ok = body.withUnsafeReadableBytes { bytes in
            ReplyScanner.scan(bytes) { item in
                switch item {
                case .event(let marker):
                    self.event(marker, now: now)
                case .other(let object):
                    switch ReplyScanner.plainSuccess(object) {
                    case .publish?: self.acknowledged(success: true, channel: nil, now: now)
                    case .connect?: connectSucceeded = true
                    case nil: others.append(Array(object))
                    }
                }
            }
        }
        if !ok { stats.recordError("unreadable reply: \(String(buffer: body).prefix(120))") }
        for object in others { reply(object, now: now) }
        // After the events of the same response, as `reply` would have done it.
        if connectSucceeded { pollAgain() }
    }

    /// Called when the wire has read everything currently available.
    func readComplete() {
        if pendingReceipts > 0 {
            let count = pendingReceipts
            pendingReceipts = 0
            shared.received(count)
        }
    }

    // MARK: Events

    func event(_ marker: ReplyScanner.Marker, now: UInt64) {
        let index = marker.publisher * shared.channels.count + marker.channel
        if index >= 0, index < nextSequence.count {
            let want = nextSequence[index]
            if marker.sequence == want {
                nextSequence[index] = want &+ 1
            } else if marker.sequence > want {
                stats.gaps += Int(marker.sequence - want)
                nextSequence[index] = marker.sequence &+ 1
            } else {
                stats.duplicates += 1
            }
        }
        stats.delivered(marker, now: now)
        pendingReceipts += 1
    }

    // MARK: Replies

    private func reply(_ bytes: [UInt8], now: UInt64) {
        guard case .object(let object)? = try? JSONParser().parse(bytes) else {
            stats.recordError("unreadable reply: \(String(decoding: bytes.prefix(120), as: UTF8.self))")
            return
        }
        let channel = object["channel"]?.stringValue
        let successful: Bool
        if case .bool(let b)? = object["successful"] { successful = b } else { successful = false }
        let error = object["error"]?.stringValue
        switch channel {
        case "/meta/handshake":
            guard successful, let id = object["clientId"]?.stringValue else {
                fail("handshake failed: \(error ?? "no clientId")")
                return
            }
            clientId = id
            // Only a publisher writes its id into what it sends (a subscriber's stays in its connect prefix).
            if !isSubscriber { clientIdBytes = Array(id.utf8) }
            connectPrefix = Array(
                "[{\"channel\":\"/meta/connect\",\"clientId\":\"\(id)\",\"connectionType\":\"\(shared.options.transport.rawValue)\",\"id\":\""
                    .utf8)
            if isSubscriber { sendSubscribe() } else { becomeReady() }
        case "/meta/subscribe":
            guard successful else {
                fail("subscribe failed: \(error ?? "unsuccessful")")
                return
            }
            becomeReady()
            sendConnect()
        case "/meta/connect":
            if successful {
                pollAgain()
            } else {
                stats.recordError("connect failed: \(error ?? "unsuccessful")")
                let advice = object["advice"]?.objectValue?["reconnect"]?.stringValue
                if advice == "handshake", !closed {
                    clientId = nil
                    sendHandshake()
                }
            }
        case "/meta/disconnect", "/meta/unsubscribe":
            break
        default:
            if object["successful"] == nil {
                // An event without a marker: someone else's message on our channels.
                stats.recordError("unexpected message on \(channel ?? "?")")
                return
            }
            if !successful { stats.recordError("publish failed: \(error ?? "unsuccessful")") }
            acknowledged(success: successful, channel: channel, now: now)
        }
    }

    func becomeReady() {
        guard !readyDone else { return }
        readyDone = true
        timeout?.cancel()
        timeout = nil
        let elapsed = monotonicNanoseconds() - startedAt
        _ = stats.connectTime.record(elapsed / 1000)
        stats.connected += 1
        ready.succeed(())
    }

    func fail(_ reason: String) {
        if !readyDone {
            readyDone = true
            timeout?.cancel()
            stats.connectFailures += 1
            stats.recordError(reason)
            ready.fail(BenchError(reason))
        }
        close()
    }

    func close() {
        closed = true
        stopPublishing()
        timeout?.cancel()
        wire?.close()
    }

    // MARK: Sending meta messages

    func takeId() -> Int {
        nextMessageId += 1
        return nextMessageId
    }

    private func sendHandshake() {
        send(
            "[{\"channel\":\"/meta/handshake\",\"version\":\"1.0\",\"supportedConnectionTypes\":[\(shared.supportedTypes)],\"id\":\"\(takeId())\"}]"
        )
    }

    private func sendSubscribe() {
        guard case .subscriber(let slot) = role, let clientId else { return }
        let names = shared.memberships[slot].map { "\"\(shared.channels[$0])\"" }
        let subscription = names.count == 1 ? names[0] : "[\(names.joined(separator: ","))]"
        send(
            "[{\"channel\":\"/meta/subscribe\",\"clientId\":\"\(clientId)\",\"subscription\":\(subscription),\"id\":\"\(takeId())\"}]"
        )
    }

    /// A successful `/meta/connect` reply: a subscriber polls again.
    private func pollAgain() {
        if isSubscriber, !closed { sendConnect() }
    }

    /// Only the message id changes from one `/meta/connect` to the next: the rest was encoded at the handshake.
    private func sendConnect() {
        guard clientId != nil, let wire, !closed else { return }
        wire.send(prefix: connectPrefix, id: takeId())
    }

    func send(_ text: String) {
        guard let wire, !closed else { return }
        wire.send(ByteBuffer(string: text))
    }

    // MARK: Publishing

    /// Starts publishing by `plan`; the future completes when this publisher has stopped.
    func startPublishing(_ plan: PublishPlan) -> EventLoopFuture<Void> {
        loop.preconditionInEventLoop()
        let promise = loop.makePromise(of: Void.self)
        done = promise
        self.plan = plan
        publishing = !closed
        guard publishing else {
            promise.succeed(())
            return promise.futureResult
        }
        shared.gates[publisherIndex].install(loop: loop) { [self] in self.pump() }
        nextDue = monotonicNanoseconds()
        if plan.rate > 0 {
            // Publishers are staggered over one interval, so N publishers at a fixed rate make an even stream,
            // not N simultaneous bursts.
            let interval = Double(shared.options.batch) / plan.rate * 1e9
            nextDue += UInt64(interval * Double(publisherIndex) / Double(max(1, shared.options.publishers)))
        }
        pump()
        return promise.futureResult
    }

    /// Sends one probe publish to channel 0 (the idle scenario's liveness check).
    func publishOnce(fanout: Int) {
        guard !closed else { return }
        let now = monotonicNanoseconds()
        sendFrame(count: 1, sentAt: now, fanout: [fanout])
    }

    private func stopPublishing() {
        frameTimer?.cancel()
        retryTimer?.cancel()
        frameTimer = nil
        retryTimer = nil
        guard publishing else { return }
        publishing = false
        done?.succeed(())
        done = nil
    }

    private func finished(now: UInt64) -> Bool {
        guard let plan else { return true }
        if let budget = plan.budget { return messagesInWindow >= budget }
        return now >= plan.windowEnd
    }

    /// Sends what is due (fixed rate) or what the window allows (as fast as possible).
    private func pump() {
        guard publishing, let plan else { return }
        let batch = shared.options.batch
        var now = monotonicNanoseconds()
        if finished(now: now) {
            stopPublishing()
            return
        }
        if plan.rate > 0 {
            let interval = UInt64(Double(batch) / plan.rate * 1e9)
            while nextDue <= now, publishing {
                // The intended send time is recorded, so a late send counts against latency.
                sendFrame(count: batch, sentAt: nextDue, fanout: plan.fanout)
                nextDue += interval
                if finished(now: nextDue) {
                    stopPublishing()
                    return
                }
                now = monotonicNanoseconds()
            }
            frameTimer = loop.scheduleTask(deadline: .uptimeNanoseconds(nextDue)) { [self] in self.pump() }
            return
        }
        while publishing {
            if unacked + batch > plan.windowAcks { return }  // an acknowledgement calls pump again
            if shared.outstanding >= plan.windowDeliveries {
                let gate = shared.gates[publisherIndex]
                gate.blocked.store(true, ordering: .releasing)
                // Room may have been made in between: check again, then rely on a wake or the fallback timer.
                if shared.outstanding < plan.windowDeliveries {
                    gate.blocked.store(false, ordering: .relaxed)
                    continue
                }
                retryTimer?.cancel()
                retryTimer = loop.scheduleTask(in: .milliseconds(5)) { [self] in
                    self.shared.gates[self.publisherIndex].blocked.store(false, ordering: .relaxed)
                    self.pump()
                }
                return
            }
            sendFrame(count: batch, sentAt: now, fanout: plan.fanout)
            now = monotonicNanoseconds()
            if finished(now: now) {
                stopPublishing()
                return
            }
        }
    }

    func acknowledged(success: Bool, channel: String?, now: UInt64) {
        guard !sendTimes.isEmpty else { return }
        if !success {
            stats.publishFailures += 1
            if let channel, let index = shared.channelIndex[channel], let plan, index < plan.fanout.count {
                shared.expected.wrappingDecrement(by: plan.fanout[index], ordering: .relaxed)
            }
        } else {
            stats.acks += 1
        }
        _ = stats.ackLatency.record(now > sendTimes.first!.sentAt ? (now - sendTimes.first!.sentAt) / 1000 : 0)
        sendTimes[sendTimes.startIndex].remaining -= 1
        if sendTimes.first!.remaining <= 0 { sendTimes.removeFirst() }
        unacked -= 1
        if publishing, plan?.rate == 0 { pump() }
    }

    /// Rooms are picked at random (seeded per publisher), so a batch is spread over the clients as in a chat.
    private func channelFor(message k: Int) -> Int {
        let count = shared.channels.count
        if count == 1 { return 0 }
        return Int(roomChoice.next() % UInt64(count))
    }

    private func sendFrame(count: Int, sentAt: UInt64, fanout: [Int]) {
        guard let wire, !closed else { return }
        let p = publisherIndex
        let size = shared.options.payloadBytes
        let expectedSize =
            shared.options.payload == .filler ? size : shared.options.payload == .jobProgress ? 1200 : 4600
        let centrifuge = shared.options.serverProtocol == .centrifuge
        var buffer = ByteBufferAllocator().buffer(capacity: count * (expectedSize + 160) + 2)
        if !centrifuge { buffer.writeInteger(UInt8(ascii: "[")) }
        var expected = 0
        let inWindow = plan.map { sentAt >= $0.windowStart && sentAt < $0.windowEnd } ?? false
        for k in 0..<count {
            let c = channelFor(message: messagesSent)
            let sequence = sequences[c]
            sequences[c] = sequence &+ 1
            messagesSent += 1
            if centrifuge {
                // One command per line: `{"id":N,"method":3,"params":{"channel":…,"data":…}}`.
                if k > 0 { buffer.writeInteger(UInt8(ascii: "\n")) }
                buffer.writeStaticString("{\"id\":")
                buffer.writeDecimal(takeId())
                buffer.writeStaticString(",\"method\":3,\"params\":{\"channel\":\"")
                buffer.writeString(shared.channels[c])
                buffer.writeStaticString("\",\"data\":")
                shared.options.payload.write(
                    into: &buffer, publisher: p, channel: c, sequence: sequence, sentAt: sentAt, size: size)
                buffer.writeStaticString("}}")
                if c < fanout.count { expected += fanout[c] }
                continue
            }
            if k > 0 { buffer.writeInteger(UInt8(ascii: ",")) }
            buffer.writeStaticString("{\"channel\":\"")
            buffer.writeString(shared.channels[c])
            buffer.writeStaticString("\",\"data\":")
            shared.options.payload.write(
                into: &buffer, publisher: p, channel: c, sequence: sequence, sentAt: sentAt, size: size)
            if !clientIdBytes.isEmpty {
                buffer.writeStaticString(",\"clientId\":\"")
                buffer.writeBytes(clientIdBytes)
                buffer.writeInteger(UInt8(ascii: "\""))
            }
            buffer.writeStaticString(",\"id\":\"")
            buffer.writeString(String(takeId()))
            buffer.writeStaticString("\"}")
            if c < fanout.count { expected += fanout[c] }
        }
        if !centrifuge { buffer.writeInteger(UInt8(ascii: "]")) }
        if expected > 0 { shared.expected.wrappingIncrement(by: expected, ordering: .relaxed) }
        stats.publishesSent += count
        if inWindow {
            stats.publishesInWindow += count
            messagesInWindow += count
        }
        unacked += count
        sendTimes.append((monotonicNanoseconds(), count))
        wire.send(buffer)
    }
}

public struct BenchError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}
