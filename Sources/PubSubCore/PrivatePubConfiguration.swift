/// One environment's section of PrivatePub's `config/private_pub.yml`:
///
///     production:
///       server: "https://example.com/faye"
///       secret_token: "6c1e..."
///       signature_expiration: 3600 # one hour
///
/// The `pubsub` command reads the file (with a YAML library, `PrivatePubConfiguration+YAML.swift` in the CLI);
/// this is what it found.
public struct PrivatePubConfiguration: Sendable, Equatable {
    public var server: String?
    public var secretToken: String?
    /// Seconds; nil means signatures never expire.
    public var signatureExpiration: Double?

    public init(server: String? = nil, secretToken: String? = nil, signatureExpiration: Double? = nil) {
        self.server = server
        self.secretToken = secretToken
        self.signatureExpiration = signatureExpiration
    }
}

public struct PrivatePubConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
