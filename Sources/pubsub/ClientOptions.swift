import ArgumentParser
import Bayeux
import PubSubClient
import PubSubCore

/// Where the client commands connect and with which secret.
struct ClientOptions: ParsableArguments {
    static let defaultURL = "http://127.0.0.1:9292/faye"

    @Option(
        name: [.customLong("url"), .customLong("server")],
        help: "The broker's Bayeux endpoint (PUBSUB_URL; default http://127.0.0.1:9292/faye).")
    var url: String?

    @Option(help: "The secret token shared with the broker (PUBSUB_SECRET).")
    var secret: String?

    @Option(
        help:
            "A PEM file of certificate authorities to trust for https:// and wss:// instead of the system's (PUBSUB_CA_FILE)."
    )
    var caFile: String?

    @OptionGroup var privatePub: PrivatePubConfigOptions

    /// The certificate authorities for TLS: the flag, then PUBSUB_CA_FILE; nil for the system's.
    var trustRoots: String? { caFile ?? Environment.string("PUBSUB_CA_FILE") }

    /// Flags first, then the PrivatePub file, then the environment, then the default.
    func resolve() throws -> (url: String, secret: String?) {
        let file = try privatePub.load()
        let url = self.url ?? file?.server ?? Environment.string("PUBSUB_URL") ?? Self.defaultURL
        do {
            _ = try BayeuxURL(url)
        } catch {
            throw failure(error.message, ExitStatus.usage)
        }
        let secret = self.secret ?? file?.secretToken ?? Environment.string("PUBSUB_SECRET")
        return (url, secret)
    }
}

/// The JWT of `publish` and `subscribe` (not in `ClientOptions`: `relay simperium` has a `--token` of its own).
struct JWTOptions: ParsableArguments {
    @Option(
        name: .customLong("token"),
        help:
            "A JWT for a broker with --jwt-key or --jwt-public-key: sent as ext.token with the handshake (subscribe) or each publish (PUBSUB_TOKEN)."
    )
    var jwt: String?

    /// The JWT: the flag, then PUBSUB_TOKEN.
    var token: String? { jwt ?? Environment.string("PUBSUB_TOKEN") }
}
