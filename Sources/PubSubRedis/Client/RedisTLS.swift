import NIOConcurrencyHelpers
import NIOCore
import NIOSSL

/// TLS to Redis (`rediss://`): the system trust store, or the CA file of the configuration. The certificate's
/// name is checked against the host connected to (or `tlsServerName`), as for any TLS client.
enum RedisTLS {
    struct Context {
        let context: NIOSSLContext

        func handler(serverHostname: String) throws -> NIOSSLClientHandler {
            // An IP address is checked against the certificate's IP SANs (the address connected to); SNI carries
            // names only.
            let isAddress = (try? SocketAddress(ipAddress: serverHostname, port: 0)) != nil
            return try NIOSSLClientHandler(context: context, serverHostname: isAddress ? nil : serverHostname)
        }
    }

    /// One context per (CA file) for the life of the process: loading a trust store at every reconnect would
    /// cost a file read and parse each time.
    private static let cache = NIOLockedValueBox<[String: NIOSSLContext]>([:])

    static func context(for configuration: RedisConfiguration) throws -> Context? {
        guard configuration.tls else { return nil }
        let key = configuration.caFile ?? ""
        if let cached = cache.withLockedValue({ $0[key] }) { return Context(context: cached) }
        var tls = TLSConfiguration.makeClientConfiguration()
        if let caFile = configuration.caFile { tls.trustRoots = .file(caFile) }
        let context: NIOSSLContext
        do {
            context = try NIOSSLContext(configuration: tls)
        } catch {
            throw RedisError(.tls, "cannot use the CA file \(configuration.caFile ?? "(system)"): \(error)")
        }
        cache.withLockedValue { $0[key] = context }
        return Context(context: context)
    }
}
