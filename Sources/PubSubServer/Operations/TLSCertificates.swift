import NIOConcurrencyHelpers
import NIOSSL

/// The server's certificate and key, read from PEM files, as the TLS context every new connection starts with.
///
/// `reload()` reads the files again and swaps the context atomically: connections already open keep the
/// session they negotiated, the next accepted connection gets the new certificate. A reload that fails (a
/// missing file, a key that does not match) leaves the running context in place.
final class TLSCertificates: Sendable {
    let certificatePath: String
    let keyPath: String
    private let current: NIOLockedValueBox<(context: NIOSSLContext, notValidAfter: Int)>

    init(certificatePath: String, keyPath: String) throws {
        self.certificatePath = certificatePath
        self.keyPath = keyPath
        self.current = NIOLockedValueBox(try Self.load(certificatePath: certificatePath, keyPath: keyPath))
    }

    /// The context for a connection accepted now.
    var context: NIOSSLContext { current.withLockedValue { $0.context } }

    /// The leaf certificate's expiry, in seconds since the epoch.
    var notValidAfter: Int { current.withLockedValue { $0.notValidAfter } }

    func reload() throws {
        let loaded = try Self.load(certificatePath: certificatePath, keyPath: keyPath)
        current.withLockedValue { $0 = loaded }
    }

    static func load(certificatePath: String, keyPath: String) throws -> (context: NIOSSLContext, notValidAfter: Int) {
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMFile(certificatePath)
        } catch {
            throw TLSFileError(path: certificatePath, what: "certificate", underlying: error)
        }
        guard let leaf = chain.first else {
            throw TLSFileError(path: certificatePath, what: "certificate", underlying: nil)
        }
        let key: NIOSSLPrivateKey
        do {
            key = try NIOSSLPrivateKey(file: keyPath, format: .pem)
        } catch {
            throw TLSFileError(path: keyPath, what: "private key", underlying: error)
        }
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        configuration.minimumTLSVersion = .tlsv12
        configuration.applicationProtocols = ["http/1.1"]
        let context: NIOSSLContext
        do {
            context = try NIOSSLContext(configuration: configuration)
        } catch {
            throw TLSFileError(path: keyPath, what: "key for \(certificatePath)", underlying: error)
        }
        return (context, Int(leaf.notValidAfter))
    }
}

/// A certificate or key that cannot be used, with the file it came from.
public struct TLSFileError: Error, CustomStringConvertible {
    public var path: String
    public var what: String
    public var underlying: (any Error)?

    public var description: String {
        "cannot use \(path) as the TLS \(what)" + (underlying.map { ": \($0)" } ?? ": no PEM certificate in it")
    }
}
