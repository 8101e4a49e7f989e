import NIOCore

/// What the client writes: encoded commands and one promise per reply expected (none for SUBSCRIBE).
struct RedisOutbound {
    var bytes: ByteBuffer
    var promises: [EventLoopPromise<RESPValue>]
}

/// Pipelining over one connection: replies complete promises in the order the commands were written; pub/sub
/// pushes go to `onPush`. No reply for `timeout` while replies are awaited (`ReplyDeadline`: not counting time the
/// event loop was too late to read) fails every pending command and closes the connection, since a pipeline that
/// lost its place can never be trusted again.
final class RedisConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = RESPValue
    typealias OutboundIn = RedisOutbound
    typealias OutboundOut = ByteBuffer

    private var pending = CircularBuffer<EventLoopPromise<RESPValue>>()
    private let timeout: TimeAmount
    private var deadline: ReplyDeadline
    /// Replies read since the last `channelReadComplete`.
    private var repliesInRead = 0
    private let onPush: (@Sendable (RESPValue) -> Void)?
    private var timer: RepeatedTask?

    init(timeout: TimeAmount, onPush: (@Sendable (RESPValue) -> Void)?) {
        self.timeout = timeout
        self.onPush = onPush
        self.deadline = ReplyDeadline(timeout: timeout, period: Self.period(timeout))
    }

    static func period(_ timeout: TimeAmount) -> TimeAmount {
        .nanoseconds(max(10_000_000, timeout.nanoseconds / 4))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let period = Self.period(timeout)
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleRepeatedTask(initialDelay: period, delay: period) { _ in
            let (handler, context) = loopBound.value
            handler.checkTimeout(context: context)
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        failAll(RedisError(.connectionClosed))
    }

    private func checkTimeout(context: ChannelHandlerContext) {
        guard deadline.check(now: .now(), waiting: !pending.isEmpty) else { return }
        failAll(RedisError(.timeout, "no reply within \(timeout.nanoseconds / 1_000_000) ms"))
        context.close(promise: nil)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let outbound = unwrapOutboundIn(data)
        if !outbound.promises.isEmpty {
            deadline.sent(now: .now(), idle: pending.isEmpty)
            pending.append(contentsOf: outbound.promises)
        }
        context.write(wrapOutboundOut(outbound.bytes), promise: promise)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let value = unwrapInboundIn(data)
        if let onPush, Self.isPush(value) {
            onPush(value)
            return
        }
        guard let first = pending.popFirst() else {
            // A reply nobody asked for: the stream is out of step.
            context.fireErrorCaught(RedisError(.protocolViolation, "unexpected reply"))
            return
        }
        repliesInRead += 1
        first.succeed(value)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if repliesInRead > 0 {
            repliesInRead = 0
            deadline.replied(now: .now())
        }
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        failAll(RedisError(.connectionClosed))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        failAll(error as? RedisError ?? RedisError(.protocolViolation, "\(error)"))
        context.close(promise: nil)
    }

    private func failAll(_ error: RedisError) {
        while let p = pending.popFirst() { p.fail(error) }
    }

    static func isPush(_ value: RESPValue) -> Bool {
        guard case .array(let elements?) = value, let kind = elements.first?.buffer else { return false }
        let bytes = kind.readableBytesView
        switch bytes.count {
        case 7: return bytes.elementsEqual("message".utf8)
        case 8: return bytes.elementsEqual("pmessage".utf8) || bytes.elementsEqual("smessage".utf8)
        case 9: return bytes.elementsEqual("subscribe".utf8)
        case 10: return bytes.elementsEqual("psubscribe".utf8) || bytes.elementsEqual("ssubscribe".utf8)
        case 11: return bytes.elementsEqual("unsubscribe".utf8)
        case 12: return bytes.elementsEqual("punsubscribe".utf8) || bytes.elementsEqual("sunsubscribe".utf8)
        default: return false
        }
    }
}
