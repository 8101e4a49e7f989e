import Logging
import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Drives an `AcceptBackoffState` for one listening socket: first in the listener's pipeline (before NIO's
/// accept handler), it sees every accept error and every accepted connection.
///
/// Why not NIO's `AcceptBackoffHandler`: `ServerBootstrap.bind` does not install it (only the async `bind`
/// variants do), and it would not stop the spin anyway. It delays the listener's next `read`, but when the
/// first `accept` of a read fails, NIO keeps that read pending and the socket registered for readability:
/// no new `read` is asked for, and the level-triggered poll reports the waiting connection again at once.
/// Measured with 64 descriptors and 100 clients: 3–4 s of CPU per 5 s with or without it. This handler
/// pauses the listener by turning `autoRead` off, which unregisters the socket from the poll, and on again
/// to resume.
///
/// It holds the reserve descriptor, marks the connection accepted into the reserve's slot as shed
/// (`ServerOperations.markShed`, answered 503 by the child's initializer), pauses and resumes the listener
/// as the state says, logs each burst's reports and counts every failure in `pubsub_accept_errors_total`.
final class AcceptGuard: ChannelInboundHandler, RemovableChannelHandler, NIOScheduledCallbackHandler {
    typealias InboundIn = any Channel
    typealias InboundOut = any Channel

    private let operations: ServerOperations
    private let settings: AcceptBackoffState.Settings
    private var state: AcceptBackoffState?
    private var reserve: CInt = -1
    private var context: ChannelHandlerContext?
    private var timer: NIOScheduledCallback?
    private var timerDeadline: NIODeadline?

    init(operations: ServerOperations, settings: AcceptBackoffState.Settings = .init()) {
        self.operations = operations
        self.settings = settings
    }

    // MARK: Lifecycle

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        state = AcceptBackoffState(settings: settings, reserveOpened: openReserve(), now: context.eventLoop.now)
        rearm(context: context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        cancelTimer()
        closeReserve()
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        cancelTimer()
        closeReserve()
        context.fireChannelInactive()
    }

    // MARK: Events

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard state != nil, let ioError = error as? IOError,
            let failure = AcceptBackoffState.Failure(errno: ioError.errnoCode)
        else {
            context.fireErrorCaught(error)
            return
        }
        operations.metrics.acceptFailed(failure, errno: ioError.errnoCode)
        let action = state!.acceptFailed(failure, now: context.eventLoop.now)
        if action.releaseReserve { closeReserve() }
        if action.pause { setAutoRead(false, context: context) }
        report(action.report, errno: ioError.errnoCode)
        rearm(context: context)
        // Not passed on: the listener stays open, and NIO would log every one of them.
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard state != nil else { return context.fireChannelRead(data) }
        let child = unwrapInboundIn(data)
        let reopened = state!.reserve == .released ? openReserve() : false
        if state!.accepted(now: context.eventLoop.now, reserveReopened: reopened) == .shed {
            operations.markShed(child)
            let loop = context.eventLoop
            let handler = NIOLoopBound(self, eventLoop: loop)
            let operations = self.operations
            child.closeFuture.whenComplete { _ in
                // Still marked only when it closed before its initializer ran.
                operations.unmarkShed(child)
                loop.execute { handler.value.shedConnectionClosed() }
            }
        }
        context.fireChannelRead(data)
    }

    private func shedConnectionClosed() {
        guard let context, state != nil else { return }
        if state!.reserveReturned(reopened: openReserve(), now: context.eventLoop.now) {
            setAutoRead(true, context: context)
        }
        rearm(context: context)
    }

    /// Off: the listening socket leaves the poll (NIO's `pauseRead0`); on: it is polled again, and a waiting
    /// connection is accepted.
    private func setAutoRead(_ on: Bool, context: ChannelHandlerContext) {
        try? context.channel.syncOptions?.setOption(.autoRead, value: on)
    }

    // MARK: Timer

    func handleScheduledCallback(eventLoop: some EventLoop) {
        timer = nil
        timerDeadline = nil
        guard let context, state != nil else { return }
        let now = context.eventLoop.now
        let action = state!.timerFired(now: now)
        var resume = action.resume
        if action.reopenReserve, state!.reserveReopened(openReserve(), now: now) { resume = true }
        report(action.report, errno: nil)
        if resume { setAutoRead(true, context: context) }
        rearm(context: context)
    }

    private func rearm(context: ChannelHandlerContext) {
        guard let deadline = state?.deadline else {
            cancelTimer()
            return
        }
        if let timerDeadline, timerDeadline <= deadline { return }
        cancelTimer()
        timerDeadline = deadline
        timer = try? context.eventLoop.assumeIsolated().scheduleCallback(at: deadline, handler: self)
    }

    private func cancelTimer() {
        timer?.cancel()
        timer = nil
        timerDeadline = nil
    }

    // MARK: Reserve descriptor

    /// Opens the reserve when it is not open; returns whether it is open now.
    private func openReserve() -> Bool {
        guard reserve < 0 else { return true }
        #if canImport(Darwin)
            reserve = Darwin.open("/dev/null", O_RDONLY | O_CLOEXEC)
        #elseif canImport(Musl)
            reserve = Musl.open("/dev/null", O_RDONLY | O_CLOEXEC)
        #else
            reserve = Glibc.open("/dev/null", O_RDONLY | O_CLOEXEC)
        #endif
        return reserve >= 0
    }

    private func closeReserve() {
        guard reserve >= 0 else { return }
        #if canImport(Darwin)
            _ = Darwin.close(reserve)
        #elseif canImport(Musl)
            _ = Musl.close(reserve)
        #else
            _ = Glibc.close(reserve)
        #endif
        reserve = -1
    }

    // MARK: Log

    private func report(_ report: AcceptBackoffState.Report?, errno code: CInt?) {
        guard let report else { return }
        var metadata: Logger.Metadata = [
            "pubsub.listener": "\(context?.channel.localAddress?.description ?? "?")",
            "pubsub.fd.limit":
                "\(DescriptorLimit.current().map { $0.soft == Int.max ? "unlimited" : String($0.soft) } ?? "?")",
            "pubsub.connections": "\(operations.openConnections)",
        ]
        switch report {
        case .began(let failure):
            if let code { metadata["pubsub.error"] = "\(String(cString: strerror(code)))" }
            operations.logger.warning(
                failure == .descriptors
                    ? "accept failed: no file descriptor left; answering 503 through a reserve descriptor and backing off"
                    : "accept failed: the kernel is short of memory; backing off",
                metadata: metadata)
        case .continuing(let failures, let shed):
            metadata["pubsub.accept.failures"] = "\(failures)"
            metadata["pubsub.accept.shed"] = "\(shed)"
            operations.logger.warning("accept still failing", metadata: metadata)
        case .ended(let failures, let shed, let lasted):
            metadata["pubsub.accept.failures"] = "\(failures)"
            metadata["pubsub.accept.shed"] = "\(shed)"
            let milliseconds = lasted.nanoseconds / 1_000_000
            metadata["pubsub.accept.lasted"] =
                "\(milliseconds / 1000).\(String(1000 + milliseconds % 1000).dropFirst()) s"
            operations.logger.notice("accepting connections again", metadata: metadata)
        }
    }
}
