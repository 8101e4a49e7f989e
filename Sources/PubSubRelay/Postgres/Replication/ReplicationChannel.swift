import NIOCore
import NIOPosix
import NIOSSL

/// Opens the socket of a replication connection: TCP (or a Unix socket), TLS negotiated as libpq does it (an
/// SSLRequest first, then the handshake when the server answers `S`), then the message codec. Inbound, the messages
/// of one socket read come as one element, so that the reader knows when it has read everything the server sent
/// so far (it hands out a batch then). `NIOAsyncChannel`'s back-pressure stops reading the socket while the reader
/// is behind, and TCP then stops the server.
enum ReplicationChannel {
    typealias Channel = NIOAsyncChannel<[PostgresBackendMessage], PostgresFrontendMessage>

    struct Failure: Error, Sendable, CustomStringConvertible {
        var description: String
    }

    static func connect(
        dsn: PostgresDSN, timeout: TimeAmount, on eventLoop: any EventLoop, maxMessageSize: Int
    ) async throws -> Channel {
        let tls = dsn.socketDirectory == nil ? try dsn.tlsContext() : nil
        let bootstrap = ClientBootstrap(group: eventLoop).connectTimeout(timeout)
            .channelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
        let channel: any NIOCore.Channel
        if let directory = dsn.socketDirectory {
            channel = try await bootstrap.connect(unixDomainSocketPath: directory + "/.s.PGSQL.\(dsn.port)").get()
        } else {
            channel = try await bootstrap.connect(host: dsn.host, port: dsn.port).get()
        }
        do {
            if let tls {
                // A server that takes the connection and never answers the SSLRequest is given `timeout` too.
                let silent = channel.eventLoop.scheduleTask(in: timeout) { channel.close(promise: nil) }
                defer { silent.cancel() }
                let answered = channel.eventLoop.makePromise(of: Bool.self)
                let hostname = isIPAddress(dsn.host) ? nil : dsn.host
                try await channel.eventLoop.submit {
                    let negotiation = SSLNegotiationHandler(answered: answered) {
                        try NIOSSLClientHandler(context: tls.context, serverHostname: hostname)
                    }
                    try channel.pipeline.syncOperations.addHandler(negotiation)
                }.get()
                var request = channel.allocator.buffer(capacity: 8)
                PostgresFrontendMessage.sslRequest.encode(into: &request)
                try await channel.writeAndFlush(request)
                let secured = try await answered.futureResult.get()
                if !secured && tls.enforced {
                    throw Failure(
                        description:
                            "PostgreSQL at \(dsn.endpoint) does not accept TLS (sslmode=\(dsn.sslMode.rawValue))")
                }
            }
            return try await channel.eventLoop.submit {
                let operations = channel.pipeline.syncOperations
                try operations.addHandler(
                    ByteToMessageHandler(PostgresBackendDecoder(maxMessageSize: maxMessageSize)))
                try operations.addHandler(MessageToByteHandler(PostgresFrontendEncoder()))
                try operations.addHandler(MessageBurstHandler())
                return try Channel(wrappingChannelSynchronously: channel)
            }.get()
        } catch {
            try? await channel.close()
            throw error
        }
    }

    private static func isIPAddress(_ host: String) -> Bool {
        (try? SocketAddress(ipAddress: host, port: 0)) != nil
    }
}

/// Reads the server's one-byte answer to the SSLRequest: `S` puts the TLS handler first in the pipeline, `N` goes
/// on in the clear. More bytes than the one are refused: they would be read as if they came over TLS (the
/// "buffer stuffing" of CVE-2021-23222).
final class SSLNegotiationHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    private let answered: EventLoopPromise<Bool>
    private let makeTLSHandler: () throws -> NIOSSLClientHandler
    private var done = false

    init(answered: EventLoopPromise<Bool>, makeTLSHandler: @escaping () throws -> NIOSSLClientHandler) {
        self.answered = answered
        self.makeTLSHandler = makeTLSHandler
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return }
        done = true
        var bytes = unwrapInboundIn(data)
        let answer = bytes.readInteger(as: UInt8.self)
        do {
            guard bytes.readableBytes == 0 else {
                throw ReplicationChannel.Failure(description: "PostgreSQL sent more than its answer to the SSLRequest")
            }
            switch answer {
            case UInt8(ascii: "S"):
                try context.pipeline.syncOperations.addHandler(try makeTLSHandler(), position: .first)
                context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
                answered.succeed(true)
            case UInt8(ascii: "N"):
                context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
                answered.succeed(false)
            default:
                throw ReplicationChannel.Failure(description: "PostgreSQL answered the SSLRequest with neither S nor N")
            }
        } catch {
            answered.fail(error)
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !done {
            done = true
            answered.fail(ReplicationChannel.Failure(description: "PostgreSQL closed the connection before TLS"))
        }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !done {
            done = true
            answered.fail(error)
        }
        context.close(promise: nil)
    }
}

/// Gathers the messages decoded from one read of the socket into one element.
final class MessageBurstHandler: ChannelInboundHandler {
    typealias InboundIn = PostgresBackendMessage
    typealias InboundOut = [PostgresBackendMessage]

    private var burst: [PostgresBackendMessage] = []

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        burst.append(unwrapInboundIn(data))
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        flush(context)
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        flush(context)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        flush(context)
        context.fireErrorCaught(error)
    }

    private func flush(_ context: ChannelHandlerContext) {
        guard !burst.isEmpty else { return }
        let messages = burst
        burst = []
        context.fireChannelRead(wrapInboundOut(messages))
    }
}
