import NIOCore

/// The life of one streaming replication connection (`replication=database`, PostgreSQL's "Streaming Replication
/// Protocol"): startup, authentication as the server asks (trust, cleartext, MD5, SCRAM-SHA-256), then
/// `START_REPLICATION SLOT … LOGICAL` with pgoutput, then the copy-both stream: XLogData and keepalives in, standby
/// status updates out. Events in, actions out; `ReplicationConnection` performs them. Time is an input.
///
/// The status reports only what the relay confirmed (write, flush and apply alike): the slot's confirmed position
/// never passes what the broker acknowledged and the checkpoint holds. A status goes out when the confirmed position
/// moves, when the server asks, and every `statusInterval` (the server ends a connection that stays silent for its
/// `wal_sender_timeout`).
struct ReplicationStateMachine: Sendable {
    struct Settings: Sendable, Equatable {
        var user: String
        var database: String
        var password: String?
        var slot: String
        var publication: String
        /// Where the stream starts: the server goes from its slot's confirmed position when this is below it.
        var start: LSN
        var statusInterval: TimeAmount = .seconds(10)
        /// After this long without a word from the server, a status asks it to answer; after as long again with
        /// no answer, the connection is taken as dead (a network that drops everything tells nobody).
        var silenceTimeout: TimeAmount = .seconds(30)
        var applicationName = "pubsub-relay"
    }

    enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// The server's ErrorResponse.
        case server(PostgresServerError)
        case authentication(String)
        case protocolViolation(String)
        /// The server ended the copy stream (CopyDone) or the connection.
        case streamEnded
        /// Nothing came from the server, not even the answer to a status that asked for one.
        case silent(seconds: Int64)

        var description: String {
            switch self {
            case .server(let error): error.message
            case .authentication(let text): text
            case .protocolViolation(let text): "PostgreSQL broke the replication protocol: \(text)"
            case .streamEnded: "PostgreSQL ended the replication stream"
            case .silent(let seconds):
                "no word from PostgreSQL in \(seconds) s, not even to a status that asked for one"
            }
        }
    }

    /// A standby status update ('r'): the positions, and whether the server should answer at once.
    struct StandbyStatus: Sendable, Equatable {
        var position: LSN
        var replyRequested = false

        /// The CopyData body; `clock` is microseconds since 2000-01-01 (the server only reports it).
        func bytes(clock: Int64) -> [UInt8] {
            var buffer = ByteBuffer()
            buffer.writeInteger(UInt8(ascii: "r"))
            buffer.writeInteger(position.value)  // written
            buffer.writeInteger(position.value)  // flushed
            buffer.writeInteger(position.value)  // applied
            buffer.writeInteger(clock)
            buffer.writeInteger(UInt8(replyRequested ? 1 : 0))
            return Array(buffer.readableBytesView)
        }
    }

    enum Action: Sendable, Equatable {
        case send(PostgresFrontendMessage)
        case sendStatus(StandbyStatus)
        /// The stream is open: XLogData follows.
        case streaming
        /// One pgoutput message, with the WAL position the server gave it.
        case xlogData(start: LSN, payload: ByteBuffer)
        /// The server's keepalive: everything before `serverPosition` was decoded and sent.
        case keepalive(serverPosition: LSN)
        case notice(String)
        /// The connection cannot go on: close it.
        case fail(Failure)
    }

    private enum State: Sendable {
        case initial
        case authenticating(SCRAMSHA256Client?)
        /// Authenticated; ReadyForQuery, then START_REPLICATION.
        case ready
        case startingReplication
        case streaming(Streaming)
        case failed
    }

    struct Streaming: Sendable, Equatable {
        /// What the relay confirmed (reported in every status).
        var confirmed: LSN
        /// The latest position the server said it sent, from a keepalive.
        var serverPosition: LSN
        var lastStatus: NIODeadline
        var lastKeepalive: NIODeadline?
        /// When the server last sent anything, and whether a status asked it to answer.
        var silence: SilenceDetector
    }

    let settings: Settings
    private var state: State = .initial
    private let nonce: String

    init(settings: Settings, nonce: String = SCRAMSHA256Client.randomNonce()) {
        self.settings = settings
        self.nonce = nonce
    }

    /// The startup message.
    mutating func start() -> [Action] {
        guard case .initial = state else { return [] }
        state = .authenticating(nil)
        return [
            .send(
                .startup(parameters: [
                    "user": settings.user, "database": settings.database, "replication": "database",
                    "application_name": settings.applicationName,
                ]))
        ]
    }

    /// The stream's state while it is open, for metrics and tests.
    var streaming: Streaming? {
        if case .streaming(let streaming) = state { return streaming }
        return nil
    }

    var isStreaming: Bool { streaming != nil }

    mutating func received(_ message: PostgresBackendMessage, now: NIODeadline) -> [Action] {
        switch (state, message) {
        case (.failed, _):
            return []
        case (_, .error(let error)):
            state = .failed
            return [.fail(.server(error))]
        case (_, .notice(let notice)):
            return [.notice(notice.message)]
        case (_, .parameterStatus), (_, .backendKeyData):
            return []
        case (.authenticating(let scram), .authentication(let request)):
            return authenticate(request, scram)
        case (.ready, .readyForQuery):
            state = .startingReplication
            return [.send(.query(startReplication))]
        case (.startingReplication, .copyBothResponse):
            state = .streaming(
                Streaming(
                    confirmed: settings.start, serverPosition: settings.start, lastStatus: now,
                    silence: SilenceDetector(quiet: settings.silenceTimeout, answer: settings.silenceTimeout, now: now))
            )
            return [.streaming]
        case (.streaming(var streaming), .copyData(var body)):
            // Any message answers: the server answers a status that asks with a keepalive.
            streaming.silence.answered(now: now)
            let actions = copyData(&body, &streaming, now: now)
            if case .failed = state { return actions }
            state = .streaming(streaming)
            return actions
        case (.streaming, .copyDone):
            state = .failed
            return [.fail(.streamEnded)]
        default:
            state = .failed
            return [.fail(.protocolViolation("an unexpected message (\(Self.name(of: message)))"))]
        }
    }

    /// The relay confirmed everything up to `position`: report it.
    mutating func confirmed(_ position: LSN, now: NIODeadline) -> [Action] {
        guard case .streaming(var streaming) = state, position > streaming.confirmed else { return [] }
        streaming.confirmed = position
        streaming.lastStatus = now
        state = .streaming(streaming)
        return [.sendStatus(StandbyStatus(position: position))]
    }

    /// A timer's tick: a status when none went out for `statusInterval`; one that asks for an answer after
    /// `silenceTimeout` without a word from the server; the end when that answer did not come in as long again.
    mutating func tick(now: NIODeadline) -> [Action] {
        guard case .streaming(var streaming) = state else { return [] }
        switch streaming.silence.check(now: now) {
        case .dead(let silence):
            state = .failed
            return [.fail(.silent(seconds: silence.nanoseconds / 1_000_000_000))]
        case .probe:
            streaming.lastStatus = now
            state = .streaming(streaming)
            return [.sendStatus(StandbyStatus(position: streaming.confirmed, replyRequested: true))]
        case .fine:
            break
        }
        guard now - streaming.lastStatus >= settings.statusInterval else { return [] }
        streaming.lastStatus = now
        state = .streaming(streaming)
        return [.sendStatus(StandbyStatus(position: streaming.confirmed))]
    }

    /// The reader waits for the relay (it reads nothing meanwhile): the server's silence does not count.
    mutating func waiting() {
        guard case .streaming(var streaming) = state else { return }
        streaming.silence.wait()
        state = .streaming(streaming)
    }

    /// The reader reads again.
    mutating func reading(now: NIODeadline) {
        guard case .streaming(var streaming) = state else { return }
        streaming.silence.resume(now: now)
        state = .streaming(streaming)
    }

    /// The connection closed under the machine.
    mutating func closed() -> [Action] {
        if case .failed = state { return [] }
        state = .failed
        return [.fail(.streamEnded)]
    }

    private mutating func authenticate(
        _ request: PostgresBackendMessage.Authentication, _ scram: SCRAMSHA256Client?
    ) -> [Action] {
        switch request {
        case .ok:
            state = .ready
            return []
        case .cleartextPassword:
            guard let password = settings.password else { return refuse("PostgreSQL asks for a password; none given") }
            return [.send(.password(password))]
        case .md5Password(let salt):
            guard let password = settings.password else { return refuse("PostgreSQL asks for a password; none given") }
            return [.send(.password(PostgresMD5Password.answer(user: settings.user, password: password, salt: salt)))]
        case .sasl(let mechanisms):
            guard mechanisms.contains(SCRAMSHA256Client.mechanism) else {
                return refuse("PostgreSQL offers SASL \(mechanisms.joined(separator: ", ")), not SCRAM-SHA-256")
            }
            guard let password = settings.password else { return refuse("PostgreSQL asks for a password; none given") }
            let client = SCRAMSHA256Client(password: password, nonce: nonce)
            state = .authenticating(client)
            return [.send(.saslInitialResponse(mechanism: SCRAMSHA256Client.mechanism, data: client.firstMessage))]
        case .saslContinue(let data):
            guard var client = scram else { return violation("SASLContinue before SASL") }
            do {
                let final = try client.finalMessage(after: data)
                state = .authenticating(client)
                return [.send(.saslResponse(final))]
            } catch {
                return refuse(error.description)
            }
        case .saslFinal(let data):
            guard let client = scram else { return violation("SASLFinal before SASL") }
            do {
                try client.verify(serverFinal: data)
                return []
            } catch {
                return refuse(error.description)
            }
        case .unsupported(let code):
            return refuse("PostgreSQL asks for an authentication method this relay does not speak (code \(code))")
        }
    }

    private mutating func copyData(_ body: inout ByteBuffer, _ streaming: inout Streaming, now: NIODeadline)
        -> [Action]
    {
        switch body.readInteger(as: UInt8.self) {
        case UInt8(ascii: "w"):
            guard let start = body.readInteger(as: UInt64.self), body.readInteger(as: UInt64.self) != nil,
                body.readInteger(as: Int64.self) != nil
            else { return violation("a short XLogData") }
            return [.xlogData(start: LSN(start), payload: body)]
        case UInt8(ascii: "k"):
            guard let end = body.readInteger(as: UInt64.self), body.readInteger(as: Int64.self) != nil,
                let reply = body.readInteger(as: UInt8.self)
            else { return violation("a short keepalive") }
            streaming.serverPosition = max(streaming.serverPosition, LSN(end))
            streaming.lastKeepalive = now
            var actions: [Action] = [.keepalive(serverPosition: LSN(end))]
            if reply != 0 {
                streaming.lastStatus = now
                actions.append(.sendStatus(StandbyStatus(position: streaming.confirmed)))
            }
            return actions
        case let type?:
            return violation("a copy message of type \(type)")
        case nil:
            return violation("an empty copy message")
        }
    }

    private mutating func refuse(_ text: String) -> [Action] {
        state = .failed
        return [.fail(.authentication(text))]
    }

    private mutating func violation(_ text: String) -> [Action] {
        state = .failed
        return [.fail(.protocolViolation(text))]
    }

    /// `START_REPLICATION SLOT "s" LOGICAL X/Y ("proto_version" '1', "publication_names" '"p"')`: the slot and the
    /// publication are checked names (lower-case letters, digits, underscores), quoted all the same.
    var startReplication: String {
        "START_REPLICATION SLOT \"\(settings.slot)\" LOGICAL \(settings.start) "
            + "(\"proto_version\" '1', \"publication_names\" '\"\(settings.publication)\"')"
    }

    private static func name(of message: PostgresBackendMessage) -> String {
        switch message {
        case .authentication: "Authentication"
        case .readyForQuery: "ReadyForQuery"
        case .rowDescription: "RowDescription"
        case .dataRow: "DataRow"
        case .commandComplete: "CommandComplete"
        case .copyBothResponse: "CopyBothResponse"
        case .copyData: "CopyData"
        case .copyDone: "CopyDone"
        case .other(let type): "type \(Character(Unicode.Scalar(type)))"
        default: "\(message)"
        }
    }
}
