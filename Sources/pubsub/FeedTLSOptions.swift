import ArgumentParser
import PubSubRelay

/// The TLS trust of a document feed (`pubsub relay couchdb|blip|simperium`); `--ca-file` is the broker's.
struct FeedTLSOptions: ParsableArguments {
    @Option(
        name: .customLong("feed-ca-file"),
        help: "A PEM file of certificate authorities to trust for an https:// or wss:// feed instead of the system's.")
    var caFile: String?

    /// The feed's TLS settings; an unreadable file or one without a PEM certificate is one line and exit 64.
    func make() throws -> FeedTLS {
        if let caFile, let problem = FeedTLS.problem(caFile: caFile) {
            throw failure("--feed-ca-file: \(problem)", ExitStatus.usage)
        }
        return FeedTLS(caFile: caFile)
    }
}
