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

            After any reconnect (a connection that broke while the session lives, or a session the broker \
            ended) subscribe resumes each subscription after the last event received (ext.resume), saying \
            on stderr how many events it recovered; an event the broker sends twice is printed once. With \
            --position-file the position of the last event printed on each subscription is kept in FILE, and \
            a later run resumes from it: every event since the last run, in order (docs/SUBSCRIBE.md).

            Exit status:
              0   --count messages arrived, --timeout passed without --count, or SIGINT/SIGTERM
              1   the server refused a subscription (its error is printed on stderr)
              3   events since the last position cannot all be delivered (recovered: false): refetch,
                  then run again (the position file then starts from the broker's current position);
                  --accept-gaps goes on instead
              64  bad arguments
              65  the position file is corrupt
              69  the server cannot be reached
              74  the position file cannot be written
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

    @Option(
        help: ArgumentHelp(
            "Keep the position of the last event printed on each subscription in this file, and resume from it.",
            valueName: "file"))
    var positionFile: String?

    @Flag(help: "When events cannot be recovered (recovered: false), say so and go on instead of exiting with 3.")
    var acceptGaps = false

    @Argument(help: "Channels or patterns to subscribe to.")
    var channels: [String]

    func validate() throws {
        guard !channels.isEmpty else { throw ValidationError("name at least one channel") }
        if let count, count <= 0 { throw ValidationError("--count must be positive") }
        if let timeout, !(timeout > 0 && timeout.isFinite) { throw ValidationError("--timeout must be positive") }
    }

    enum Stop: Sendable {
        case counted, timedOut, signalled, unrecovered
    }

    /// What the callbacks of one run share with it: why it stops, how to stop the consumer, and the channels
    /// whose events could not be recovered.
    final class Outcome: Sendable {
        let stop = NIOLockedValueBox<Stop?>(nil)
        let interrupt = NIOLockedValueBox<(@Sendable () -> Void)?>(nil)
        let lost = NIOLockedValueBox<[String]>([])

        /// Records why the run stops (the first reason stays) and stops the consumer.
        func end(_ reason: Stop) {
            stop.withLockedValue { $0 = $0 ?? reason }
            interrupt.withLockedValue { $0 }?()
        }
    }

    func run() async throws {
        // Trapped before anything else, so a SIGTERM that comes early still ends the command cleanly.
        let signalSequence = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        let (url, secret) = try client.resolve()
        for channel in channels where !Channel.isSubscribable(channel) {
            throw failure(
                "cannot subscribe to \(channel): not a channel name or pattern outside /meta and /service",
                ExitStatus.usage)
        }
        if hmac && secret == nil {
            throw failure("--hmac needs a secret (--secret or PUBSUB_SECRET)", ExitStatus.usage)
        }
        let file = positionFile.map { PositionFile(path: $0) }
        let stored: SubscriptionPositions?
        do {
            stored = try file?.read()
        } catch {
            throw failure(error.message, ExitStatus.dataError)
        }
        let outcome = Outcome()
        let bayeux: BayeuxClient
        do {
            bayeux = try BayeuxClient(url: url, configuration: configuration(secret: secret, outcome: outcome))
        } catch let error as BayeuxClientError {
            throw failure(error)
        }
        let recorder = try await subscribe(bayeux, stored: stored, file: file)
        if !quiet {
            printError("pubsub: subscribed to \(channels.joined(separator: ", ")) (\(bayeux.connectionType))")
        }
        let result = await consume(bayeux, recorder: recorder, outcome: outcome, signals: signalSequence)
        try await finish(bayeux, result: result, recorder: recorder, outcome: outcome)
    }

    /// The client's configuration: resume on, the callbacks that report on stderr, signed subscriptions.
    private func configuration(secret: String?, outcome: Outcome) -> BayeuxClient.Configuration {
        let (quiet, acceptGaps) = (self.quiet, self.acceptGaps)
        var configuration = BayeuxClient.Configuration(transport: websocket ? .webSocket : .automatic)
        configuration.trustRoots = client.trustRoots
        configuration.resume = true
        if let token = jwt.token { configuration.handshakeExt = ["token": .string(token)] }
        configuration.onSessionLost = { error in
            printError("pubsub: the broker ended this session (\(error)); subscribing again")
        }
        configuration.onConnectionLost = { error in
            printError("pubsub: the connection to the broker broke (\(error)); reconnecting and resuming")
        }
        configuration.onResumed = { channel, resumed in
            if resumed.recovered {
                if !quiet { printError("pubsub: resumed \(channel): recovered \(resumed.missed) events") }
                return
            }
            outcome.lost.withLockedValue { $0.append(channel) }
            let missed = resumed.missed > 0 ? ", at least \(resumed.missed) events missed" : ""
            printError(
                "pubsub: resumed \(channel), but events published meanwhile are gone (recovered: false\(missed))"
                    + (acceptGaps ? "; going on from here" : ": refetch"))
            if !acceptGaps { outcome.end(.unrecovered) }
        }
        if let secret { configuration.subscriptionExt = Self.signer(secret: secret, hmac: hmac) }
        return configuration
    }

    /// Signs each subscription with PrivatePub's SHA-1 scheme or HMAC-SHA256 bound to the clientId.
    private static func signer(secret: String, hmac: Bool) -> @Sendable (String, String) -> JSONObject? {
        { channel, clientId in
            let timestamp = String(nowMilliseconds())
            if hmac {
                let signature = PrivatePubAuth.hmacSignature(
                    secret: secret, channel: channel, timestamp: timestamp, clientId: clientId)
                return ["signature": .string(signature), "timestamp": .number(timestamp)]
            }
            let signature = PrivatePubAuth.signature(secret: secret, channel: channel, timestamp: timestamp)
            return ["private_pub_signature": .string(signature), "private_pub_timestamp": .number(timestamp)]
        }
    }

    /// Subscribes to every channel (resuming from the position file's positions) and returns what keeps the
    /// positions in the file; exits when a subscription is refused, the broker gives no positions for a file, or
    /// events are gone without --accept-gaps.
    private func subscribe(_ bayeux: BayeuxClient, stored: SubscriptionPositions?, file: PositionFile?)
        async throws -> PositionRecorder?
    {
        let unrecovered: [String]
        do {
            unrecovered = try await subscribeAll(bayeux, from: stored, in: file)
        } catch let error as BayeuxClientError {
            await bayeux.close()
            throw failure(error)
        }
        let recorder = file.flatMap { file in
            Self.startPositions(channels, stored: stored, unrecovered: unrecovered, now: bayeux.receivedPositions)
                .map { PositionRecorder(file: file, positions: $0) }
        }
        if file != nil && recorder == nil {
            await bayeux.close()
            throw failure(
                "--position-file needs a broker that gives positions (pubsub with its history on)",
                ExitStatus.notRecovered)
        }
        do {
            try recorder?.flush()
        } catch {
            await bayeux.close()
            throw failure("\(error)", ExitStatus.ioError)
        }
        if !unrecovered.isEmpty && !acceptGaps {
            await bayeux.disconnect()
            throw ExitCode(ExitStatus.notRecovered)
        }
        return recorder
    }

    /// Prints each event as it comes until --count, --timeout, a signal or an unrecovered resume stops it;
    /// returns how many were printed, or why the stream ended.
    private func consume(
        _ bayeux: BayeuxClient, recorder: PositionRecorder?, outcome: Outcome,
        signals signalSequence: UnixSignalsSequence
    ) async -> Result<Int, any Error> {
        let (full, count) = (self.full, self.count)
        let consumer = Task { () async throws -> Int in
            var received = 0
            for try await message in bayeux.events {
                let value: JSONValue = full ? .object(message.fields) : (message.data ?? .null)
                writeLine(value.jsonString)
                try recorder?.record(message)
                received += 1
                if let count, received >= count {
                    outcome.stop.withLockedValue { $0 = $0 ?? .counted }
                    break
                }
            }
            return received
        }
        let timer = timeout.map { seconds in
            Task {
                try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
                outcome.stop.withLockedValue { $0 = $0 ?? .timedOut }
                consumer.cancel()
            }
        }
        let signals = Task {
            for await _ in signalSequence {
                outcome.stop.withLockedValue { $0 = $0 ?? .signalled }
                consumer.cancel()
                return
            }
        }
        outcome.interrupt.withLockedValue { $0 = { consumer.cancel() } }
        if outcome.stop.withLockedValue({ $0 }) == .unrecovered { consumer.cancel() }
        let flusher = recorder.map { recorder in
            Task {
                while !Task.isCancelled {
                    try await Task.sleep(nanoseconds: UInt64(PositionRecorder.durableEvery.nanoseconds))
                    try recorder.flush()
                }
            }
        }
        let result = await consumer.result
        timer?.cancel()
        flusher?.cancel()
        _ = signals  // left waiting: the process ends next
        return result
    }

    /// Keeps the last positions, says goodbye to the broker, and turns how the run ended into its exit status.
    private func finish(
        _ bayeux: BayeuxClient, result: Result<Int, any Error>, recorder: PositionRecorder?, outcome: Outcome
    ) async throws {
        let ending = outcome.stop.withLockedValue { $0 }
        if let recorder {
            // Subscriptions whose events are gone continue from where the broker resumed them.
            if ending == .unrecovered || acceptGaps {
                let now = bayeux.receivedPositions
                for channel in outcome.lost.withLockedValue({ $0 }) { recorder.set(channel, now[channel: channel]) }
            }
            do {
                try recorder.flush()
            } catch {
                await bayeux.disconnect()
                throw failure("\(error)", ExitStatus.ioError)
            }
        }
        await bayeux.disconnect()
        switch (result, ending) {
        case (_, .unrecovered?):
            throw ExitCode(ExitStatus.notRecovered)
        case (_, .counted?), (_, .signalled?):
            return
        case (.success(let received), .timedOut?):
            if let count, received < count {
                throw failure(
                    "timed out after \(AuthOptions.number(timeout!)) s with \(received) of \(count) messages",
                    ExitStatus.tempFail)
            }
        case (.failure(let error as BayeuxClientError), _):
            throw failure(error)
        case (.failure(let error as PositionFile.Error), _):
            throw failure(error.message, ExitStatus.ioError)
        case (.failure(let error), _):
            throw failure("subscription ended: \(error)", ExitStatus.tempFail)
        case (.success, nil):
            throw failure("the subscription ended", ExitStatus.tempFail)
        }
    }
}
