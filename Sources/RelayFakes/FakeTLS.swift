import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import NIOSSL

/// `relay-fake <kind> --tls-cert CERT.pem --tls-key KEY.pem`: the fake serves HTTPS / WSS with that certificate
/// (chain) and private key instead of plain HTTP / WS.
public struct FakeTLS: Sendable {
    public var certificateFile: String
    public var keyFile: String

    public init(certificateFile: String, keyFile: String) {
        self.certificateFile = certificateFile
        self.keyFile = keyFile
    }

    /// Takes `--tls-cert` and `--tls-key` (both or neither) out of `arguments`; nil when neither is there.
    public static func extract(from arguments: inout [String]) throws -> FakeTLS? {
        var certificate: String?
        var key: String?
        var rest: [String] = []
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            switch argument {
            case "--tls-cert", "--tls-key":
                guard let value = iterator.next() else { throw FakeUsageError("\(argument) needs a value") }
                if argument == "--tls-cert" { certificate = value } else { key = value }
            default:
                rest.append(argument)
            }
        }
        arguments = rest
        switch (certificate, key) {
        case (nil, nil): return nil
        case (let certificate?, let key?): return FakeTLS(certificateFile: certificate, keyFile: key)
        default: throw FakeUsageError("--tls-cert and --tls-key go together")
        }
    }

    /// `base` wrapped in TLS with this certificate and key.
    func server(_ base: HTTPServerBuilder) throws -> HTTPServerBuilder {
        let chain = try NIOSSLCertificate.fromPEMFile(certificateFile).map(NIOSSLCertificateSource.certificate)
        let key = try NIOSSLPrivateKey(file: keyFile, format: .pem)
        let configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: chain, privateKey: .privateKey(key))
        return try .tls(base, tlsConfiguration: configuration)
    }

    /// `base`, in TLS when `tls` is set.
    static func server(_ tls: FakeTLS?, _ base: HTTPServerBuilder) throws -> HTTPServerBuilder {
        guard let tls else { return base }
        return try tls.server(base)
    }
}
