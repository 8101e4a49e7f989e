import Logging
import PubSubServer
import ServiceLifecycle
import UnixSignals

/// Reloads the TLS certificate and key on SIGHUP (after a renewal), without dropping connections.
struct CertificateReloader: Service {
    let server: PubSubServer
    /// Trapped before the broker listens, so a SIGHUP that comes early waits here instead of ending the process.
    let signals: UnixSignalsSequence
    let logger: Logger

    func run() async throws {
        for await _ in signals.cancelOnGracefulShutdown() {
            guard server.configuration.operations.tls != nil else {
                logger.info("SIGHUP: no TLS certificate to reload")
                continue
            }
            // A failure is logged by the server, which keeps the certificate it has.
            try? server.reloadCertificates()
        }
    }
}
