import NIOCore
import NIOPosix

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

extension ClientBootstrap {
    /// A bootstrap for one load-generator connection, bound to `source` (port 0) before connecting when given.
    ///
    /// On Linux the socket also gets `IP_BIND_ADDRESS_NO_PORT`, so the local port is chosen at `connect` for the
    /// whole 4-tuple instead of by a search over every port of the address in `bind`.
    ///
    /// Reads start at 512 bytes (NIO's default is 2,048) and adapt as NIO's do: the channel keeps its last receive
    /// buffer for the next read, so an idle subscriber holds one buffer of this size, and a million of them hold
    /// 1.5 GB less. Upgrade responses and the replies and events a subscriber reads fit in it.
    static func bench(group: any EventLoop, source: String?) -> ClientBootstrap {
        var bootstrap = ClientBootstrap(group: group)
            .channelOption(
                .recvAllocator, value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 512, maximum: 65536))
        guard let source, let address = try? SocketAddress(ipAddress: source, port: 0) else { return bootstrap }
        #if os(Linux)
            // IP_BIND_ADDRESS_NO_PORT (include/uapi/linux/in.h).
            bootstrap = bootstrap.channelOption(
                ChannelOptions.Types.SocketOption(level: SocketOptionLevel(IPPROTO_IP), name: SocketOptionName(24)),
                value: 1)
        #endif
        return bootstrap.bind(to: address)
    }
}
