import Bayeux
import NIOSSL
import PostgresNIO

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A libpq-style connection URL: `postgres[ql]://[user[:password]@][host][:port][/database][?host=/socket/dir]`.
/// `host=` naming a directory connects to the Unix socket `<dir>/.s.PGSQL.<port>`. TLS as libpq does it:
/// `sslmode=disable`; `allow` and `prefer` (the default) use TLS when the server offers it, without checking its
/// certificate; `require` insists on TLS (and checks the certificate against `sslrootcert` when one is named);
/// `verify-ca` checks the certificate against `sslrootcert` (or the system's roots); `verify-full` also checks
/// that it names the host.
public struct PostgresDSN: Sendable, Equatable {
    public enum SSLMode: String, Sendable, Equatable, CaseIterable {
        case disable, allow, prefer, require
        case verifyCA = "verify-ca"
        case verifyFull = "verify-full"
    }

    public var user: String
    public var password: String?
    public var host: String
    public var port: Int
    public var database: String
    /// The socket directory, when connecting over a Unix socket.
    public var socketDirectory: String?
    public var sslMode: SSLMode = .prefer
    /// PEM file of the certificate authorities trusted for the server's certificate.
    public var sslRootCertificate: String?

    public init(_ text: String) throws(RelayError) {
        var rest = Substring(text)
        if rest.hasPrefix("postgres://") {
            rest = rest.dropFirst("postgres://".count)
        } else if rest.hasPrefix("postgresql://") {
            rest = rest.dropFirst("postgresql://".count)
        } else {
            throw RelayError(.invalidURL, "invalid --dsn \(text): expected postgres://user@host:port/database")
        }
        var query = Substring("")
        if let mark = rest.firstIndex(of: "?") {
            query = rest[rest.index(after: mark)...]
            rest = rest[..<mark]
        }
        var path = Substring("")
        if let slash = rest.firstIndex(of: "/") {
            path = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
        }
        let authority: URLAuthority
        do throws(URLAuthority.Failure) {
            authority = try URLAuthority(rest)
        } catch {
            switch error {
            case .badPort(let port): throw RelayError(.invalidURL, "invalid --dsn \(text): bad port \(port)")
            case .unclosedBracket, .junkAfterBracket: throw RelayError(.invalidURL, "invalid --dsn \(text): bad host")
            }
        }
        user = try authority.user.map(Self.decode) ?? "postgres"
        password = try authority.password.map(Self.decode)
        host = authority.host.isEmpty ? "127.0.0.1" : authority.host
        port = authority.port ?? 5432
        database = path.isEmpty ? user : try Self.decode(path)
        for pair in query.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let name = parts[0]
            let value = parts.count > 1 ? try Self.decode(parts[1]) : ""
            switch name {
            case "host":
                if value.hasPrefix("/") { socketDirectory = value } else { host = value }
            case "port":
                port = try Self.port(Substring(value), text)
            case "user":
                user = value
            case "password":
                password = value
            case "dbname":
                database = value
            case "sslmode":
                guard let mode = SSLMode(rawValue: value) else {
                    let modes = SSLMode.allCases.map(\.rawValue).joined(separator: ", ")
                    throw RelayError(.invalidURL, "invalid --dsn: sslmode=\(value) (expected one of \(modes))")
                }
                sslMode = mode
            case "sslrootcert":
                guard access(value, R_OK) == 0 else {
                    throw RelayError(.invalidURL, "invalid --dsn: sslrootcert=\(value) cannot be read")
                }
                sslRootCertificate = value
            case "application_name", "connect_timeout":
                break
            default:
                throw RelayError(.invalidURL, "invalid --dsn: unknown parameter \(name)")
            }
        }
    }

    /// The connection settings; throws when the TLS settings cannot be loaded (an unreadable `sslrootcert`).
    public func configuration() throws -> PostgresConnection.Configuration {
        if let socketDirectory {
            return PostgresConnection.Configuration(
                unixSocketPath: socketDirectory + "/.s.PGSQL.\(port)", username: user, password: password,
                database: database)
        }
        return PostgresConnection.Configuration(
            host: host, port: port, username: user, password: password, database: database, tls: try tls())
    }

    func tls() throws -> PostgresConnection.Configuration.TLS {
        guard let (context, enforced) = try tlsContext() else { return .disable }
        return enforced ? .require(context) : .prefer(context)
    }

    /// The TLS context for `sslmode`, and whether TLS is required; nil with `sslmode=disable`.
    func tlsContext() throws -> (context: NIOSSLContext, enforced: Bool)? {
        var tls = TLSConfiguration.makeClientConfiguration()
        switch sslMode {
        case .disable:
            return nil
        case .allow, .prefer:
            tls.certificateVerification = .none
            return (try NIOSSLContext(configuration: tls), false)
        case .require:
            tls.certificateVerification = sslRootCertificate == nil ? .none : .noHostnameVerification
        case .verifyCA:
            tls.certificateVerification = .noHostnameVerification
        case .verifyFull:
            tls.certificateVerification = .fullVerification
        }
        if let sslRootCertificate { tls.trustRoots = .file(sslRootCertificate) }
        return (try NIOSSLContext(configuration: tls), true)
    }

    /// Where it connects, without the password, for logs and errors.
    public var endpoint: String {
        socketDirectory.map { "\($0)/.s.PGSQL.\(port)" } ?? "\(host):\(port)"
    }

    private static func port(_ text: Substring, _ dsn: String) throws(RelayError) -> Int {
        guard let port = Int(text), (1...65535).contains(port) else {
            throw RelayError(.invalidURL, "invalid --dsn \(dsn): bad port \(text)")
        }
        return port
    }

    private static func decode(_ text: some StringProtocol) throws(RelayError) -> String {
        do throws(PercentDecoding.Failure) {
            return try PercentDecoding.decode(text)
        } catch {
            switch error {
            case .badEscape: throw RelayError(.invalidURL, "invalid --dsn: bad percent-escape in \(text)")
            case .notUTF8: throw RelayError(.invalidURL, "invalid --dsn: \(text) is not UTF-8")
            }
        }
    }
}
