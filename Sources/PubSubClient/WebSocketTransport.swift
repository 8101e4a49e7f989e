import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket

/// Bayeux over one WebSocket: every message list goes out as one text frame; replies are matched to their
/// requests by `id`, and events pushed by the server are handed on as they arrive. A closed socket is reopened
/// on the next exchange (the Bayeux session outlives the socket).
final class WebSocketTransport: BayeuxTransport, Sendable {
    let connectionType = ConnectionType.websocket
    let url: BayeuxURL
    let group: any EventLoopGroup
    let configuration: BayeuxClient.Configuration
    let onEvents: @Sendable ([Message]) -> Void
    let tls: NIOSSLContext?

    /// Requests waiting for replies, by message id.
    private struct Waiter {
        var sent: [Message]
        var remaining: Set<JSONValue>
        var replies: [Message]
        var promise: EventLoopPromise<[Message]>
    }

    private struct State {
        var channel: (any NIOCore.Channel)?
        var opening: Task<any NIOCore.Channel, any Error>?
        var waiters: [Int: Waiter] = [:]
        var byId: [JSONValue: Int] = [:]
        var nextWaiter = 0
        var closed = false
        /// A socket closed or failed while the client was not closing: see `takeInterruption()`.
        var interrupted = false
    }

    private let state = NIOLockedValueBox(State())

    init(
        url: BayeuxURL, group: any EventLoopGroup, configuration: BayeuxClient.Configuration, tls: NIOSSLContext?,
        onEvents: @escaping @Sendable ([Message]) -> Void
    ) {
        self.url = url
        self.group = group
        self.configuration = configuration
        self.tls = tls
        self.onEvents = onEvents
    }

    private func channel() async throws -> any NIOCore.Channel {
        enum Next {
            case ready(any NIOCore.Channel)
            case wait(Task<any NIOCore.Channel, any Error>)
        }
        let next: Next = try state.withLockedValue { s in
            if s.closed { throw BayeuxClientError(.notConnected, "the client is closed") }
            if let c = s.channel, c.isActive { return .ready(c) }
            if let t = s.opening { return .wait(t) }
            let task = Task { try await self.open() }
            s.opening = task
            return .wait(task)
        }
        switch next {
        case .ready(let c): return c
        case .wait(let task):
            do {
                let c = try await task.value
                state.withLockedValue { s in
                    if s.opening == task { s.opening = nil }
                    s.channel = c
                }
                return c
            } catch {
                state.withLockedValue { s in if s.opening == task { s.opening = nil } }
                throw error
            }
        }
    }

    private func open() async throws -> any NIOCore.Channel {
        let url = self.url
        let maxFrame = configuration.maxFrameBytes
        let upgraded: EventLoopFuture<(any NIOCore.Channel)?>
        do {
            upgraded = try await ClientBootstrap(group: group)
                .connectTimeout(configuration.connectTimeout)
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .connect(host: url.host, port: url.port) { [tls] channel in
                    channel.eventLoop.makeCompletedFuture {
                        if let tls {
                            try channel.pipeline.syncOperations.addHandler(
                                NIOSSLClientHandler(context: tls, serverHostname: url.tlsServerName))
                        }
                        let upgrader = NIOTypedWebSocketClientUpgrader<(any NIOCore.Channel)?>(
                            maxFrameSize: maxFrame,
                            upgradePipelineHandler: { channel, _ in
                                channel.eventLoop.makeCompletedFuture {
                                    let sync = channel.pipeline.syncOperations
                                    try sync.addHandler(
                                        NIOWebSocketFrameAggregator(
                                            minNonFinalFragmentSize: 0, maxAccumulatedFrameCount: 4096,
                                            maxAccumulatedFrameSize: maxFrame))
                                    try sync.addHandler(WebSocketFrameHandler(transport: self))
                                    return channel
                                }
                            })
                        var headers = HTTPHeaders()
                        headers.add(name: "Host", value: url.hostHeader)
                        headers.add(name: "Content-Length", value: "0")
                        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: url.path, headers: headers)
                        let upgrade = NIOTypedHTTPClientUpgradeConfiguration<(any NIOCore.Channel)?>(
                            upgradeRequestHead: head, upgraders: [upgrader],
                            notUpgradingCompletionHandler: { channel in
                                channel.close(promise: nil)
                                return channel.eventLoop.makeSucceededFuture(nil)
                            })
                        return try channel.pipeline.syncOperations.configureUpgradableHTTPClientPipeline(
                            configuration: .init(upgradeConfiguration: upgrade))
                    }
                }
        } catch {
            throw BayeuxClientError(.unreachable, "cannot connect to \(url.hostHeader): \(describe(error))")
        }
        let timeout = configuration.connectTimeout
        let promise = upgraded.eventLoop.makePromise(of: (any NIOCore.Channel)?.self)
        upgraded.cascade(to: promise)
        let timer = upgraded.eventLoop.scheduleTask(in: timeout) {
            promise.fail(
                BayeuxClientError(
                    .timeout, "no WebSocket upgrade from \(url.hostHeader) within \(seconds(timeout))"))
        }
        promise.futureResult.whenComplete { _ in timer.cancel() }
        let result: (any NIOCore.Channel)?
        do {
            result = try await promise.futureResult.get()
        } catch let error as BayeuxClientError {
            throw error
        } catch let error where error is NIOSSLError || error is NIOSSLExtraError || error is BoringSSLError {
            // The server is there but cannot be trusted (or speaks no TLS): as good as unreachable.
            throw BayeuxClientError(.unreachable, "TLS with \(url.hostHeader) failed: \(describe(error))")
        } catch {
            throw BayeuxClientError(.protocolError, "WebSocket upgrade to \(url) failed: \(describe(error))")
        }
        guard let channel = result else {
            throw BayeuxClientError(.protocolError, "the server at \(url) refused the WebSocket upgrade")
        }
        return channel
    }

    // MARK: Called by the frame handler, on the channel's event loop.

    func received(_ payload: ByteBuffer) {
        guard let messages = try? ReplySorter.parse(payload) else { return }
        var events: [Message] = []
        var completed: [(EventLoopPromise<[Message]>, [Message])] = []
        state.withLockedValue { s in
            for message in messages {
                if message["successful"] != nil, let id = message.id, let key = s.byId[id],
                    var waiter = s.waiters[key],
                    waiter.sent.contains(where: { $0.id == id && $0.channel == message.channel })
                {
                    waiter.replies.append(message)
                    waiter.remaining.remove(id)
                    s.byId[id] = nil
                    if waiter.remaining.isEmpty {
                        s.waiters[key] = nil
                        completed.append((waiter.promise, waiter.replies))
                    } else {
                        s.waiters[key] = waiter
                    }
                } else if let channel = message.channel, !Bayeux.Channel.isMeta(channel), message["successful"] == nil {
                    events.append(message)
                }
            }
        }
        if !events.isEmpty { onEvents(events) }
        for (promise, replies) in completed { promise.succeed(replies) }
    }

    func closedByPeer(_ channel: any NIOCore.Channel) {
        let failed: [EventLoopPromise<[Message]>] = state.withLockedValue { s in
            guard s.channel === channel else { return [] }
            s.channel = nil
            if !s.closed { s.interrupted = true }
            let promises = s.waiters.values.map(\.promise)
            s.waiters = [:]
            s.byId = [:]
            return promises
        }
        let error = BayeuxClientError(.connectionClosed, "the WebSocket to \(url) closed before the server answered")
        for p in failed { p.fail(error) }
    }

    // MARK: BayeuxTransport

    private func start(_ messages: [Message], timeout: TimeAmount) async throws
        -> (key: Int, promise: EventLoopPromise<[Message]>)
    {
        try await start(groups: [messages], timeouts: [timeout])[0]
    }

    /// Writes the groups as one frame, each with its own waiter (and timeout).
    private func start(groups: [[Message]], timeouts: [TimeAmount]) async throws
        -> [(key: Int, promise: EventLoopPromise<[Message]>)]
    {
        let channel = try await channel()
        var started: [(key: Int, promise: EventLoopPromise<[Message]>)] = []
        for (messages, timeout) in zip(groups, timeouts) {
            let promise = channel.eventLoop.makePromise(of: [Message].self)
            let key: Int = state.withLockedValue { s in
                let key = s.nextWaiter
                s.nextWaiter += 1
                let ids = Set(messages.compactMap(\.id))
                s.waiters[key] = Waiter(sent: messages, remaining: ids, replies: [], promise: promise)
                for id in ids { s.byId[id] = key }
                return key
            }
            let timer = channel.eventLoop.scheduleTask(in: timeout) {
                self.forget(key)
                promise.fail(
                    BayeuxClientError(.timeout, "no answer from \(self.url.hostHeader) within \(seconds(timeout))"))
            }
            promise.futureResult.whenComplete { _ in timer.cancel() }
            started.append((key, promise))
        }
        let frame = WebSocketFrame(
            fin: true, opcode: .text, maskKey: .random(), data: ReplySorter.encode(groups.flatMap { $0 }))
        channel.writeAndFlush(frame).whenFailure { [started] error in
            for (key, promise) in started {
                self.forget(key)
                promise.fail(BayeuxClientError(.connectionClosed, "cannot send on the WebSocket: \(describe(error))"))
            }
        }
        for ((key, promise), messages) in zip(started, groups) where messages.allSatisfy({ $0.id == nil }) {
            forget(key)
            promise.succeed([])
        }
        return started
    }

    private func wait(_ started: (key: Int, promise: EventLoopPromise<[Message]>)) async throws -> [Message] {
        try await pending(started).get()
    }

    private func pending(_ started: (key: Int, promise: EventLoopPromise<[Message]>)) -> PendingReplies {
        PendingReplies(future: started.promise.futureResult) {
            self.forget(started.key)
            started.promise.fail(CancellationError())
        }
    }

    private func forget(_ key: Int) {
        state.withLockedValue { s in
            if let waiter = s.waiters.removeValue(forKey: key) {
                for id in waiter.remaining { s.byId[id] = nil }
            }
        }
    }

    func exchange(_ messages: [Message], timeout: TimeAmount) async throws -> [Message] {
        try await wait(try await start(messages, timeout: timeout))
    }

    func exchange(groups: [[Message]], timeouts: [TimeAmount]) async throws -> [PendingReplies] {
        try await start(groups: groups, timeouts: timeouts).map(pending)
    }

    func takeInterruption() -> Bool {
        state.withLockedValue { s in
            defer { s.interrupted = false }
            return s.interrupted
        }
    }

    func exchangePipelined(_ batches: [[Message]], window: Int, timeout: TimeAmount) async throws -> [[Message]] {
        var results: [[Message]] = []
        results.reserveCapacity(batches.count)
        var inflight: [(key: Int, promise: EventLoopPromise<[Message]>)] = []
        var next = 0
        while next < batches.count || !inflight.isEmpty {
            while inflight.count < max(1, window), next < batches.count {
                inflight.append(try await start(batches[next], timeout: timeout))
                next += 1
            }
            results.append(try await wait(inflight.removeFirst()))
        }
        return results
    }

    func close() async {
        let channel: (any NIOCore.Channel)? = state.withLockedValue { s in
            s.closed = true
            defer { s.channel = nil }
            return s.channel
        }
        if let channel {
            let frame = WebSocketFrame(
                fin: true, opcode: .connectionClose, maskKey: .random(),
                data: ByteBuffer(bytes: [0x03, 0xE8]))  // 1000, normal closure
            try? await channel.writeAndFlush(frame).get()
            try? await channel.close().get()
        }
    }
}

/// The last handler of an upgraded channel: text frames to the transport, pings answered, closes echoed.
final class WebSocketFrameHandler: ChannelInboundHandler {
    typealias InboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    let transport: WebSocketTransport
    private var closing = false

    init(transport: WebSocketTransport) { self.transport = transport }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        switch frame.opcode {
        case .text, .binary:
            transport.received(frame.unmaskedData)
        case .ping:
            let pong = WebSocketFrame(fin: true, opcode: .pong, maskKey: .random(), data: frame.unmaskedData)
            context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
        case .connectionClose:
            if !closing {
                closing = true
                let reply = WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: .random(), data: ByteBuffer())
                context.writeAndFlush(wrapOutboundOut(reply)).assumeIsolated().whenComplete { _ in
                    context.close(promise: nil)
                }
            }
        default:
            break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        transport.closedByPeer(context.channel)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
