import NIOSSL

/// How a document feed's `https://` or `wss://` connection trusts the server's certificate (CouchDB, Sync Gateway
/// BLIP, Simperium): the system's certificate authorities, or only those of a PEM file (`--feed-ca-file`,
/// `feed_ca_file`).
public struct FeedTLS: Sendable, Equatable {
    /// A PEM file of certificate authorities trusted instead of the system's; nil: the system's.
    public var caFile: String?

    public init(caFile: String? = nil) { self.caFile = caFile }

    static let settingKeys: Set<String> = ["feed_ca_file"]

    /// From the feed's `feed_ca_file`, checked as `--feed-ca-file` is.
    init(settings: FeedSettings) throws {
        let caFile = try settings.optionalString("feed_ca_file")
        if let caFile, let problem = Self.problem(caFile: caFile) { throw settings.error("feed_ca_file", problem) }
        self.init(caFile: caFile)
    }

    /// Why `path` cannot be used as the trusted authorities (unreadable, no PEM certificate in it), or nil.
    public static func problem(caFile path: String) -> String? {
        do {
            return try NIOSSLCertificate.fromPEMFile(path).isEmpty ? "\(path) holds no PEM certificate" : nil
        } catch {
            return "cannot read PEM certificates from \(path): \(error)"
        }
    }

    /// The client configuration: the defaults of `makeClientConfiguration()`, trusting only `caFile`'s authorities
    /// when it is set.
    public var clientConfiguration: TLSConfiguration {
        var tls = TLSConfiguration.makeClientConfiguration()
        if let caFile { tls.trustRoots = .file(caFile) }
        return tls
    }

    /// Whether `error` is a TLS handshake the server's certificate failed (not trusted, wrong name, expired), as
    /// NIOSSL reports it (also when AsyncHTTPClient or WSClient wrap it).
    public static func isCertificateFailure(_ error: any Error) -> Bool {
        let text = "\(error)"
        return text.contains("CERTIFICATE_VERIFY_FAILED") || text.contains("unableToValidateCertificate")
    }

    /// `error` in one line; a refused certificate says so, and what to do about it.
    public static func describe(_ error: any Error) -> String {
        let text = "\(error)"
        if isCertificateFailure(error) {
            return "TLS certificate verification failed (trust the server's authority with --feed-ca-file / "
                + "feed_ca_file): \(text)"
        }
        if text.contains("cannotUseIPAddressInSNI") {
            // WSClient always sends the URL's host as SNI, which TLS forbids for an IP address.
            return "a wss:// URL needs a host name, not an IP address: \(text)"
        }
        return text
    }
}
