import ArgumentParser
import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import PubSubClient
import PubSubCore
import UnixSignals

struct Subscribe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Subscribe to channels and print each message's data as one JSON line.",
        discussion: """
            With a secret (--secret, then PUBSUB_SECRET) every subscription is signed, with PrivatePub's \
            SHA-1 scheme or, with --hmac, with HMAC-SHA256 bound to this client's id; a re-subscription \
            after the server forgot the session is signed afresh. Once every subscription is accepted, a \
            line saying so goes to stderr (unless --quiet). Channels may be patterns: /chat/*, /chat/**. \
            The URL is --url, then PUBSUB_URL, then http://127.0.0.1:9292/faye; a ws:// URL or --websocket \
            uses a WebSocket, otherwise long-polling.

            Exit status:
              0   --count messages arrived, --timeout passed without --count, or SIGINT/SIGTERM
              1   the server refused a subscription (its error is printed on stderr)
              64  bad arguments
              69  the server cannot be reached
              75  --timeout passed before --count messages arrived, or the session broke
            """
    )

    @OptionGroup var client: ClientOptions
    @OptionGroup var jwt: JWTOptions

    @Option(help: "Exit after this many messages.")
    var count: Int?

    @Option(help: "Exit after this many seconds (with status 75 if --count messages did not arrive by then).")
    var timeout: Double?

    @Flag(help: "Print the whole message (channel, data, id, ext), not only its data.")
    var full = false

    @Flag(help: "Sign with HMAC-SHA256 bound to the clientId instead of PrivatePub's SHA-1.")
    var hmac = false

    @Flag(help: "Use a WebSocket instead of long-polling (also chosen by a ws:// URL).")
    var websocket = false

    @Flag(name: .shortAndLong, help: "Do not report the subscriptions on stderr.")
    var quiet = false

    @Argument(help: "Channels or patterns to subscribe to.")
    var channels: [String]

    func validate() throws {
        guard !channels.isEmpty else { throw ValidationError("name at least one channel") }
        if let count, count <= 0 { throw ValidationError("--count must be positive") }
        if let timeout, !(timeout > 0 && timeout.isFinite) { throw ValidationError("--timeout must be positive") }
    }

    enum Stop: Sendable {
        case counted, timedOut, signalled
    }

    func run() async throws {
        // Trapped before anything else, so a SIGTERM that comes early still ends the command cleanly.
        let signalSequence = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        let (url, secret) = try client.resolve()
        for channel in channels where !Channel.isSubscribable(channel) {
            throw failure("cannot subscribe to \(channel): not a channel name or pattern outside /meta and /service",
                          ExitStatus.usage)
        }
        if hmac && secret == nil { throw failure("--hmac needs a secret (--secret or PUBSUB_SECRET)", ExitStatus.usage) }
        let useHMAC = hmac
        var configuration = BayeuxClient.Configuration(transport: websocket ? .webSocket : .automatic)
        configuration.trustRoots = client.trustRoots
        if let token = jwt.token { configuration.handshakeExt = ["token": .string(token)] }
        configuration.onSessionLost = { error in
            printError("pubsub: the broker ended this session (\(error)); subscribing again: events published in between may be missing")
        }
        if let secret {
            configuration.subscriptionExt = { channel, clientId in
                let timestamp = String(nowMilliseconds())
                if useHMAC {
                    let signature = PrivatePubAuth.hmacSignature(
                        secret: secret, channel: channel, timestamp: timestamp, clientId: clientId)
                    return ["signature": .string(signature), "timestamp": .number(timestamp)]
                }
                let signature = PrivatePubAuth.signature(secret: secret, channel: channel, timestamp: timestamp)
                return ["private_pub_signature": .string(signature), "private_pub_timestamp": .number(timestamp)]
            }
        }
        let bayeux: BayeuxClient
        do {
            bayeux = try BayeuxClient(url: url, configuration: configuration)
        } catch let error as BayeuxClientError {
            throw failure(error)
        }
        do {
            for channel in channels { try await bayeux.subscribe(channel) }
        } catch let error as BayeuxClientError {
            await bayeux.close()
            throw failure(error)
        }
        if !quiet {
            printError("pubsub: subscribed to \(channels.joined(separator: ", ")) (\(bayeux.connectionType))")
        }

        let stop = NIOLockedValueBox<Stop?>(nil)
        let (full, count) = (self.full, self.count)
        let consumer = Task { () async throws -> Int in
            var received = 0
            for try await message in bayeux.events {
                let value: JSONValue = full ? .object(message.fields) : (message.data ?? .null)
                writeLine(value.jsonString)
                received += 1
                if let count, received >= count {
                    stop.withLockedValue { $0 = $0 ?? .counted }
                    break
                }
            }
            return received
        }
        let timer = timeout.map { seconds in
            Task {
                try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
                stop.withLockedValue { $0 = $0 ?? .timedOut }
                consumer.cancel()
            }
        }
        let signals = Task {
            for await _ in signalSequence {
                stop.withLockedValue { $0 = $0 ?? .signalled }
                consumer.cancel()
                return
            }
        }
        let result = await consumer.result
        timer?.cancel()
        _ = signals  // left waiting: the process ends next
        await bayeux.disconnect()
        switch (result, stop.withLockedValue { $0 }) {
        case (_, .counted?), (_, .signalled?):
            return
        case (.success(let received), .timedOut?):
            if let count, received < count {
                throw failure("timed out after \(AuthOptions.number(timeout!)) s with \(received) of \(count) messages",
                              ExitStatus.tempFail)
            }
        case (.failure(let error as BayeuxClientError), _):
            throw failure(error)
        case (.failure(let error), _):
            throw failure("subscription ended: \(error)", ExitStatus.tempFail)
        case (.success, nil):
            throw failure("the subscription ended", ExitStatus.tempFail)
        }
    }
}
