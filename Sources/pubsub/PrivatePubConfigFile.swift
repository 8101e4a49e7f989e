import ArgumentParser
import PubSubCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// `--privatepub-config FILE --environment ENV`: PrivatePub's `config/private_pub.yml`, read as it is.
struct PrivatePubConfigOptions: ParsableArguments {
    @Option(
        name: .customLong("privatepub-config"),
        help: ArgumentHelp(
            "Read server, secret_token and signature_expiration from PrivatePub's YAML file (PUBSUB_PRIVATEPUB_CONFIG).",
            valueName: "file"))
    var file: String?

    @Option(help: "The section of that file to use (PUBSUB_ENVIRONMENT, RAILS_ENV, RACK_ENV, then development).")
    var environment: String?

    /// The chosen section, or nil when no file was named. Failures print one line and exit with 78.
    func load() throws -> PrivatePubConfiguration? {
        guard let path = file ?? Environment.string("PUBSUB_PRIVATEPUB_CONFIG") else {
            if environment != nil {
                throw failure("--environment needs --privatepub-config", ExitStatus.usage)
            }
            return nil
        }
        let env =
            environment ?? Environment.string("PUBSUB_ENVIRONMENT") ?? Environment.string("RAILS_ENV")
            ?? Environment.string("RACK_ENV") ?? "development"
        guard let bytes = readFile(path) else {
            let reason = String(cString: strerror(errno))
            throw failure("cannot read \(path): \(reason)", ExitStatus.config)
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw failure("\(path) is not UTF-8 text", ExitStatus.config)
        }
        do {
            return try PrivatePubConfiguration.parse(text, environment: env, file: path)
        } catch let error as PrivatePubConfigurationError {
            throw failure(error.message, ExitStatus.config)
        }
    }
}
