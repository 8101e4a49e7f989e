import ArgumentParser
import Bayeux
import NIOCore
import PubSubClient

struct Publish: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Publish JSON to a channel, for scripts, cron jobs and background workers.",
        discussion: """
            The data is the JSON argument or, without one, standard input. With --lines every non-empty \
            line of standard input is one message: all lines are checked before any is sent, then they are \
            published in order, pipelined (--batch-size messages per request, 8 requests in flight). The secret \
            (--secret, then PUBSUB_SECRET) is sent as ext.private_pub_token, as PrivatePub's publish_to \
            does. The URL is --url, then PUBSUB_URL, then http://127.0.0.1:9292/faye.

            Invalid JSON, a wildcard or invalid channel, or a /meta channel fail before anything is sent. \
            An unreachable server fails within a few seconds (3 s to connect) with one line on stderr. \
            HTTP 429 Too Many Requests is retried after its Retry-After (at most 30 s), up to 5 times.

            Exit status:
              0   the server acknowledged every message
              1   the server refused a message (its error is printed on stderr)
              64  bad arguments (wildcard or invalid channel, bad URL)
              65  the data is not valid JSON (nothing was sent)
              69  the server cannot be reached, or answered with an HTTP error
              75  no answer in time, connection lost, or still rate limited: retry later
              76  the server's answer was not Bayeux
              78  the --privatepub-config file cannot be used
            """
    )

    @OptionGroup var client: ClientOptions
    @OptionGroup var jwt: JWTOptions

    @Flag(help: "Read newline-delimited JSON from standard input, one message per line.")
    var lines = false

    @Flag(help: "Wrap the data as PrivatePub's publish_to does: {\"channel\": CHANNEL, \"data\": DATA}.")
    var privatepub = false

    @Flag(
        help:
            "The data is JavaScript for PrivatePub's browsers to run: {\"channel\": CHANNEL, \"eval\": JS} (implies --privatepub)."
    )
    var eval = false

    @Option(help: "Seconds to wait for each answer from the server.")
    var timeout: Double = 10

    @Option(help: "With --lines: messages per request (lower it when the broker's rate limit counts messages).")
    var batchSize: Int = 100

    @Argument(help: "The channel, e.g. /messages/new (no wildcards).")
    var channel: String

    @Argument(help: "The data as JSON (JavaScript with --eval); read from standard input when absent.")
    var data: String?

    func validate() throws {
        if lines && data != nil {
            throw ValidationError("give the data on standard input with --lines, not as an argument")
        }
        guard timeout > 0, timeout.isFinite else { throw ValidationError("--timeout must be positive") }
        guard batchSize > 0 else { throw ValidationError("--batch-size must be positive") }
    }

    func run() async throws {
        let (url, secret) = try client.resolve()
        try Self.checkPublishable(channel)
        let payloads = try readPayloads()
        var ext: JSONObject?
        if let secret { ext = ["private_pub_token": .string(secret)] }
        if let token = jwt.token {
            var withToken = ext ?? [:]
            withToken["token"] = .string(token)
            ext = withToken
        }
        var configuration = BayeuxClient.Configuration(
            transport: .longPolling, requestTimeout: .nanoseconds(Int64(timeout * 1e9)), batchSize: batchSize)
        configuration.trustRoots = client.trustRoots
        let bayeux: BayeuxClient
        do {
            bayeux = try BayeuxClient(url: url, configuration: configuration)
        } catch let error as BayeuxClientError {
            throw failure(error)
        }
        do {
            try await send(payloads, ext: ext, with: bayeux)
            await bayeux.close()
        } catch let error as BayeuxClientError {
            await bayeux.close()
            throw failure(error)
        } catch {
            await bayeux.close()
            throw error
        }
    }

    private func send(_ payloads: [JSONValue], ext: JSONObject?, with bayeux: BayeuxClient) async throws {
        if payloads.count == 1 && !lines {
            try await bayeux.publish(channel, data: payloads[0], ext: ext)
            return
        }
        let results = try await bayeux.publish(
            payloads.map { BayeuxClient.Publication(channel: channel, data: $0, ext: ext) })
        let refused = results.enumerated().filter { !$0.element.successful }
        for (index, result) in refused.prefix(20) {
            printError("pubsub: message \(index + 1): refused by the server: \(result.error ?? "refused")")
        }
        if refused.count > 20 { printError("pubsub: … and \(refused.count - 20) more refused") }
        if !refused.isEmpty {
            printError("pubsub: \(results.count - refused.count) of \(results.count) messages acknowledged")
            throw ExitCode(ExitStatus.refused)
        }
    }

    /// A publishable channel: a valid name, not a pattern, not under /meta.
    static func checkPublishable(_ channel: String) throws {
        switch Channel.kind(of: channel) {
        case .name?:
            if Channel.isMeta(channel) {
                throw failure("cannot publish to a /meta channel: \(channel)", ExitStatus.usage)
            }
        case .singleWildcard?, .deepWildcard?:
            throw failure("cannot publish to a wildcard channel: \(channel)", ExitStatus.usage)
        case nil:
            throw failure("invalid channel name: \(channel) (expected /segment/segment...)", ExitStatus.usage)
        }
    }

    /// The data of every message to send, already wrapped, all checked before anything is sent.
    func readPayloads() throws -> [JSONValue] {
        var texts: [(line: Int?, text: String)] = []
        if let data {
            texts = [(nil, data)]
        } else {
            let input = readStandardInput()
            guard let text = String(validating: input, as: UTF8.self) else {
                throw failure("standard input is not UTF-8 text", ExitStatus.dataError)
            }
            if lines {
                let all = text.split(omittingEmptySubsequences: false) { $0 == "\n" || $0 == "\r\n" }
                for (index, line) in all.enumerated() where !line.allSatisfy(\.isWhitespace) {
                    texts.append((index + 1, String(line)))
                }
                if texts.isEmpty {
                    throw failure("no lines on standard input: nothing to publish", ExitStatus.dataError)
                }
            } else {
                var body = Substring(text)
                if eval { while body.last == "\n" || body.last == "\r\n" { body = body.dropLast() } }
                guard !body.allSatisfy(\.isWhitespace) else {
                    throw failure("no data: give JSON as an argument or on standard input", ExitStatus.dataError)
                }
                texts = [(nil, String(body))]
            }
        }
        return try texts.map { line, text in
            let where_ = line.map { "line \($0): " } ?? ""
            let value: JSONValue
            if eval {
                value = .string(text)
            } else {
                do {
                    value = try JSONParser().parse(text)
                } catch {
                    throw failure("\(where_)invalid JSON: \(error); nothing was sent", ExitStatus.dataError)
                }
            }
            if eval { return .object(["channel": .string(channel), "eval": value]) }
            if privatepub { return .object(["channel": .string(channel), "data": value]) }
            return value
        }
    }
}
