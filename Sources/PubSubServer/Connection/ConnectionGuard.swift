import Logging
import NIOCore

/// Drives a `ConnectionGuardState` for one connection: first in the pipeline after TLS, it sees every byte
/// read, writability changes and every close asked for. It performs the machine's actions: closes, and lingers
/// (closes the output, reads and drops) when a connection is closed with a request half read. The machine's next deadline is this connection's entry in its loop's
/// `LoopTimers` (one shared queue and one NIO timer per loop, not a scheduled task per connection); an event
/// that moves the deadline later leaves the entry as it is, and it fires early to find nothing due (as NIO's
/// `IdleStateHandler` does), so reads never reschedule it.
///
/// The HTTP handlers tell it what happens on their side with outbound user events (`ConnectionGuard.Event`),
/// sent by `HTTPExchangeProbe`; without a guard in the pipeline those events reach the head and are dropped.
/// After a WebSocket upgrade the `WebSocketHandler`'s driver takes the machine over (`handOver()`) and the guard
/// leaves the pipeline: the WebSocket's pings and silence are timed there.
final class ConnectionGuard: ChannelDuplexHandler, RemovableChannelHandler, TimerQueueOwner {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = IOData
    typealias OutboundOut = IOData

    /// What the HTTP and WebSocket layers report.
    enum Event: Sendable, Equatable {
        case requestHead
        case requestEnd
        /// The response's end has been written.
        case responseEnd
        /// Close now, without lingering: the end of a drain.
        case abort
    }

    private var state: ConnectionGuardState
    private var context: ChannelHandlerContext?
    /// The timers of this connection's loop, where its deadline is armed.
    private var timers: LoopTimers?
    var timerQueueIndex = -1
    /// Promises of closes asked for while lingering: completed when the connection is closed.
    private var pendingClose: EventLoopPromise<Void>?

    convenience init(timeouts: ConnectionTimeouts, pingInterval: TimeAmount, logger: Logger? = nil) {
        self.init(settings: ConnectionGuardSettings(timeouts: timeouts, pingInterval: pingInterval, logger: logger))
    }

    init(settings: ConnectionGuardSettings) {
        self.state = ConnectionGuardState(settings: settings, now: .now())
    }

    private var logger: Logger? { state.settings.logger }

    /// The machine's phase, for tests.
    var phase: ConnectionGuardState.Phase { state.phase }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        timers = state.settings.loopTimers.timers(for: context.eventLoop)
        // Time is the loop's (an embedded loop's in tests): the connection starts now.
        state = ConnectionGuardState(settings: state.settings, now: context.eventLoop.now)
        rearm(context: context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        cancelTimer()
        self.context = nil
        timers = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        state.closed()
        cancelTimer()
        if let pendingClose {
            self.pendingClose = nil
            pendingClose.succeed(())
        }
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let count = unwrapInboundIn(data).readableBytes
        switch state.bytesReceived(count, now: context.eventLoop.now) {
        case .forward:
            // The first byte of a later request brings its header deadline before the idle one.
            rearm(context: context)
            context.fireChannelRead(data)
        case .discard:
            break
        case .close(let reason):
            close(context: context, reason: reason)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if state.isLingering {
            // Handlers above may hold reads back (the pipelining handler does during a response): lingering reads on.
            context.read()
            rearm(context: context)
            return
        }
        context.fireChannelReadComplete()
        // Before the channel asks the pipeline to read: the pipelining handler would hold that read back.
        if state.readsOnWhileAwaitingResponse { context.read() }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        state.writabilityChanged(
            isWritable: context.channel.isWritable, unsentBytes: unsentBytes(context), now: context.eventLoop.now)
        rearm(context: context)
        context.fireChannelWritabilityChanged()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // The output closed by a lingering close is this handler's business only.
        if state.isLingering, let event = event as? ChannelEvent, event == .outputClosed { return }
        context.fireUserInboundEventTriggered(event)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let event = event as? Event else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        handle(event, context: context, promise: promise)
    }

    /// An event of the HTTP exchange, from the `HTTPExchangeProbe` of this pipeline (on the event loop).
    func exchange(_ event: Event) {
        guard let context else { return }
        handle(event, context: context, promise: nil)
    }

    private func handle(_ event: Event, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        let now = context.eventLoop.now
        switch event {
        case .requestHead: state.requestHead(now: now)
        case .requestEnd: state.requestEnd(now: now)
        case .responseEnd: state.responseEnd(now: now)
        case .abort:
            state.closed()
            cancelTimer()
            context.close(mode: .all, promise: promise)
            return
        }
        rearm(context: context)
        promise?.succeed(())
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard mode == .all else {
            context.close(mode: mode, promise: promise)
            return
        }
        switch state.closeRequested(now: context.eventLoop.now) {
        case .closeNow:
            cancelTimer()
            context.close(mode: .all, promise: promise)
        case .alreadyClosing:
            guard let promise else { return }
            if let pendingClose {
                pendingClose.futureResult.cascade(to: promise)
            } else if context.channel.isActive {
                pendingClose = promise
            } else {
                promise.fail(ChannelError.alreadyClosed)
            }
        case .linger:
            if let promise {
                if let pendingClose { pendingClose.futureResult.cascade(to: promise) } else { pendingClose = promise }
            }
            let halfClosed = context.eventLoop.makePromise(of: Void.self)
            context.close(mode: .output, promise: halfClosed)
            halfClosed.futureResult.assumeIsolated().whenFailure { _ in
                // No half-closure here (or the output is gone already): close at once.
                context.close(mode: .all, promise: nil)
            }
            context.read()
            rearm(context: context)
        }
    }

    /// Hands the connection's timing to the handler that takes it over (the WebSocket handler, which then removes
    /// this guard: one handler and pipeline context less for every open WebSocket). Nothing stays armed here.
    func handOver() -> ConnectionGuardState {
        cancelTimer()
        return state
    }

    // MARK: Timer

    private func rearm(context: ChannelHandlerContext) {
        guard let timers else { return }
        // Nothing due (a response awaited): the entry stays and fires early to find nothing, so a long-poll
        // parked and answered takes no timer heap work.
        guard let deadline = state.deadline else { return }
        if let armed = timers.deadline(of: self), armed <= deadline { return }
        timers.schedule(self, at: deadline)
    }

    func timerQueueDeadlineReached() {
        timerFired()
    }

    private func cancelTimer() {
        timers?.cancel(self)
    }

    private func timerFired() {
        guard let context else { return }
        switch state.timerFired(now: context.eventLoop.now, unsentBytes: unsentBytes(context)) {
        case .none:
            break
        case .ping:
            // Only a WebSocket is pinged, and its driver times it once the guard has handed over.
            break
        case .close(let reason):
            close(context: context, reason: reason)
            return
        }
        rearm(context: context)
    }

    /// Bytes written to the channel and not yet taken by the socket: whether a response is still going out, and
    /// whether a blocked connection makes progress. Read on timers and writability changes only.
    private func unsentBytes(_ context: ChannelHandlerContext) -> Int {
        (try? context.channel.syncOptions?.getOption(ChannelOptions.bufferedWritableBytes)) ?? 0
    }

    private func close(context: ChannelHandlerContext, reason: ConnectionGuardState.CloseReason) {
        cancelTimer()
        logger?.debug(
            "closing connection",
            metadata: [
                "pubsub.reason": "\(reason.rawValue)",
                "pubsub.remote": "\(context.channel.remoteAddress?.description ?? "?")",
            ])
        context.close(mode: .all, promise: nil)
    }
}
