import ArgumentParser
import Bayeux
import PubSubCore

struct Sign: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a subscription signature as PrivatePub's subscribe_to helper hands it to the browser.",
        discussion: """
            Prints {"server":…,"timestamp":…,"channel":…,"signature":…} on one line, the object \
            PrivatePub.sign() takes. The signature is hex(SHA-1(secret + channel + timestamp)), timestamp in \
            milliseconds. With --hmac it is hex(HMAC-SHA256(secret, "subscribe\\nCHANNEL\\nTIMESTAMP\\nCLIENTID")), \
            to be sent as ext.signature and ext.timestamp; CLIENTID is empty unless --client-id binds the \
            signature to one client. A pattern (/chat/*) may be signed: the signature is good for that exact \
            pattern only. The server is --server, then PUBSUB_URL, then http://127.0.0.1:9292/faye.
            """
    )

    @OptionGroup var client: ClientOptions

    @Flag(help: "Sign with HMAC-SHA256 (the broker runs with --signatures hmac or both).")
    var hmac = false

    @Option(help: "With --hmac: bind the signature to this clientId.")
    var clientId: String?

    @Option(help: "Milliseconds since the epoch to sign; default now.")
    var timestamp: Int64?

    @Argument(help: "The channel or pattern to sign.")
    var channel: String

    func validate() throws {
        if clientId != nil && !hmac { throw ValidationError("--client-id only applies to --hmac signatures") }
    }

    func run() async throws {
        let (url, secret) = try client.resolve()
        guard let secret else { throw failure("no secret: pass --secret or set PUBSUB_SECRET", ExitStatus.usage) }
        // Signing is arithmetic on the string, as in PrivatePub; the broker judges the channel when it is used.
        guard !channel.isEmpty else { throw failure("the channel must not be empty", ExitStatus.usage) }
        let ts = String(timestamp ?? nowMilliseconds())
        let signature =
            hmac
            ? PrivatePubAuth.hmacSignature(secret: secret, channel: channel, timestamp: ts, clientId: clientId)
            : PrivatePubAuth.signature(secret: secret, channel: channel, timestamp: ts)
        var object: JSONObject = [
            "server": .string(url), "timestamp": .number(ts), "channel": .string(channel),
            "signature": .string(signature),
        ]
        if let clientId { object["clientId"] = .string(clientId) }
        writeLine(object.jsonString)
    }
}
