import NIOCore
import NIOPosix
import Testing

@testable import PubSubRelay

/// The replication connection's machine, driven without a socket.
@Suite struct ReplicationStateMachineTests {
    static let settings = ReplicationStateMachine.Settings(
        user: "relay", database: "app", password: "pencil", slot: "relay_test", publication: "pubsub_relay_test",
        start: LSN(0x16_B374_D848))

    static func streaming(_ machine: inout ReplicationStateMachine, now: NIODeadline) {
        _ = machine.start()
        _ = machine.received(.authentication(.ok), now: now)
        _ = machine.received(.readyForQuery, now: now)
        #expect(machine.received(.copyBothResponse, now: now) == [.streaming])
    }

    static func copyData(_ bytes: (inout ByteBuffer) -> Void) -> PostgresBackendMessage {
        var buffer = ByteBuffer()
        bytes(&buffer)
        return .copyData(buffer)
    }

    @Test func trustThenStartReplicationThenTheStream() {
        var machine = ReplicationStateMachine(settings: Self.settings, nonce: "n")
        let now = NIODeadline.uptimeNanoseconds(1_000_000_000)
        #expect(
            machine.start() == [
                .send(
                    .startup(parameters: [
                        "user": "relay", "database": "app", "replication": "database",
                        "application_name": "pubsub-relay",
                    ]))
            ])
        #expect(machine.received(.authentication(.ok), now: now).isEmpty)
        #expect(machine.received(.parameterStatus(name: "server_version", value: "15.20"), now: now).isEmpty)
        #expect(machine.received(.backendKeyData, now: now).isEmpty)
        #expect(
            machine.received(.readyForQuery, now: now) == [
                .send(
                    .query(
                        #"START_REPLICATION SLOT "relay_test" LOGICAL 16/B374D848 ("proto_version" '1', "publication_names" '"pubsub_relay_test"')"#
                    ))
            ])
        #expect(machine.received(.copyBothResponse, now: now) == [.streaming])
        #expect(machine.isStreaming)
        let xlog = Self.copyData {
            $0.writeInteger(UInt8(ascii: "w"))
            $0.writeInteger(UInt64(0x100))
            $0.writeInteger(UInt64(0x200))
            $0.writeInteger(Int64(0))
            $0.writeBytes([UInt8(ascii: "B"), 1, 2])
        }
        #expect(
            machine.received(xlog, now: now) == [.xlogData(start: LSN(0x100), payload: ByteBuffer(bytes: [66, 1, 2]))])
    }

    @Test func aKeepaliveIsAnsweredWithWhatWasConfirmedOnlyWhenAsked() {
        var machine = ReplicationStateMachine(settings: Self.settings)
        let now = NIODeadline.uptimeNanoseconds(1_000_000_000)
        Self.streaming(&machine, now: now)
        func keepalive(_ end: UInt64, reply: Bool) -> PostgresBackendMessage {
            Self.copyData {
                $0.writeInteger(UInt8(ascii: "k"))
                $0.writeInteger(end)
                $0.writeInteger(Int64(0))
                $0.writeInteger(UInt8(reply ? 1 : 0))
            }
        }
        #expect(
            machine.received(keepalive(0x20_0000_0000, reply: false), now: now) == [
                .keepalive(serverPosition: LSN(0x20_0000_0000))
            ])
        #expect(
            machine.received(keepalive(0x20_0000_0100, reply: true), now: now) == [
                .keepalive(serverPosition: LSN(0x20_0000_0100)),
                .sendStatus(.init(position: Self.settings.start)),
            ])
        // What the relay confirmed goes out at once, and only forwards.
        #expect(machine.confirmed(LSN(0x17_0000_0000), now: now) == [.sendStatus(.init(position: LSN(0x17_0000_0000)))])
        #expect(machine.confirmed(LSN(0x16_0000_0000), now: now).isEmpty)
        // Then a status every ten seconds.
        #expect(machine.tick(now: now + .seconds(9)).isEmpty)
        #expect(machine.tick(now: now + .seconds(10)) == [.sendStatus(.init(position: LSN(0x17_0000_0000)))])
    }

    @Test func aSilentServerIsAskedToAnswerThenGivenUp() {
        var machine = ReplicationStateMachine(settings: Self.settings)
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        Self.streaming(&machine, now: start)
        #expect(machine.tick(now: start + .seconds(10)) == [.sendStatus(.init(position: Self.settings.start))])
        #expect(
            machine.tick(now: start + .seconds(30)) == [
                .sendStatus(.init(position: Self.settings.start, replyRequested: true))
            ])
        // An answer (any message) ends the wait.
        let keepalive = Self.copyData {
            $0.writeInteger(UInt8(ascii: "k"))
            $0.writeInteger(UInt64(1))
            $0.writeInteger(Int64(0))
            $0.writeInteger(UInt8(0))
        }
        _ = machine.received(keepalive, now: start + .seconds(31))
        #expect(machine.tick(now: start + .seconds(59)).isEmpty == false)  // the ten-second status only
        #expect(machine.streaming?.silence.probeSent == nil)
        // A wait for the relay does not count.
        machine.waiting()
        #expect(machine.tick(now: start + .seconds(200)) == [.sendStatus(.init(position: Self.settings.start))])
        machine.reading(now: start + .seconds(200))
        // No answer at all: asked at 230, given up after 260.
        #expect(
            machine.tick(now: start + .seconds(230)).first
                == .sendStatus(.init(position: Self.settings.start, replyRequested: true)))
        #expect(machine.tick(now: start + .seconds(260)) == [.sendStatus(.init(position: Self.settings.start))])
        #expect(machine.tick(now: start + .seconds(261)) == [.fail(.silent(seconds: 61))])
        #expect(!machine.isStreaming)
    }

    @Test func theStatusBytes() {
        let status = ReplicationStateMachine.StandbyStatus(position: LSN(0x0102_0304_0506_0708))
        let bytes = status.bytes(clock: 0x1122)
        #expect(bytes.count == 34)
        #expect(bytes[0] == UInt8(ascii: "r"))
        #expect(Array(bytes[1...8]) == [1, 2, 3, 4, 5, 6, 7, 8])
        #expect(Array(bytes[9...16]) == [1, 2, 3, 4, 5, 6, 7, 8])
        #expect(Array(bytes[17...24]) == [1, 2, 3, 4, 5, 6, 7, 8])
        #expect(Array(bytes[25...32]) == [0, 0, 0, 0, 0, 0, 0x11, 0x22])
        #expect(bytes[33] == 0)
    }

    @Test func md5AndCleartextPasswords() {
        var machine = ReplicationStateMachine(settings: Self.settings)
        _ = machine.start()
        // md5(md5("pencil" + "relay") + salt), as PostgreSQL computes it.
        let expected = PostgresMD5Password.answer(user: "relay", password: "pencil", salt: [1, 2, 3, 4])
        #expect(expected.hasPrefix("md5") && expected.count == 35)
        #expect(
            machine.received(.authentication(.md5Password(salt: [1, 2, 3, 4])), now: .now()) == [
                .send(.password(expected))
            ])
        var clear = ReplicationStateMachine(settings: Self.settings)
        _ = clear.start()
        #expect(clear.received(.authentication(.cleartextPassword), now: .now()) == [.send(.password("pencil"))])
        var none = ReplicationStateMachine(
            settings: .init(user: "u", database: "d", slot: "s", publication: "p", start: LSN(0)))
        _ = none.start()
        #expect(
            none.received(.authentication(.md5Password(salt: [0, 0, 0, 0])), now: .now()) == [
                .fail(.authentication("PostgreSQL asks for a password; none given"))
            ])
    }

    /// RFC 7677's example exchange (user "user", password "pencil").
    @Test func scramSHA256AsRFC7677() throws {
        var client = SCRAMSHA256Client(password: "pencil", nonce: "rOprNGfwEbeRWgbNEkqO", user: "user")
        #expect(String(decoding: client.firstMessage, as: UTF8.self) == "n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
        let final = try client.finalMessage(
            after: Array("r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".utf8))
        #expect(
            String(decoding: final, as: UTF8.self)
                == "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        )
        try client.verify(serverFinal: Array("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".utf8))
        #expect(throws: SCRAMSHA256Client.Failure.serverSignatureMismatch) {
            try client.verify(serverFinal: Array("v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".utf8))
        }
    }

    @Test func scramThroughTheMachine() {
        var machine = ReplicationStateMachine(settings: Self.settings, nonce: "abc")
        _ = machine.start()
        #expect(
            machine.received(.authentication(.sasl(mechanisms: ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"])), now: .now())
                == [
                    .send(.saslInitialResponse(mechanism: "SCRAM-SHA-256", data: Array("n,,n=,r=abc".utf8)))
                ])
        // A server nonce that does not extend ours is refused.
        #expect(
            machine.received(.authentication(.saslContinue(Array("r=xyz,s=AAAA,i=4096".utf8))), now: .now()) == [
                .fail(.authentication("PostgreSQL's SCRAM nonce does not extend ours"))
            ])
        var other = ReplicationStateMachine(settings: Self.settings)
        _ = other.start()
        #expect(
            other.received(.authentication(.sasl(mechanisms: ["OAUTHBEARER"])), now: .now()) == [
                .fail(.authentication("PostgreSQL offers SASL OAUTHBEARER, not SCRAM-SHA-256"))
            ])
    }

    @Test func anErrorOrTheStreamsEndFailsTheConnectionOnce() {
        var machine = ReplicationStateMachine(settings: Self.settings)
        Self.streaming(&machine, now: .now())
        let error = PostgresServerError(fields: [
            UInt8(ascii: "C"): "55000", UInt8(ascii: "M"): "can no longer get changes",
        ])
        #expect(machine.received(.error(error), now: .now()) == [.fail(.server(error))])
        #expect(machine.received(.copyDone, now: .now()).isEmpty)
        #expect(machine.confirmed(LSN(1 << 40), now: .now()).isEmpty)
        var ended = ReplicationStateMachine(settings: Self.settings)
        Self.streaming(&ended, now: .now())
        #expect(ended.received(.copyDone, now: .now()) == [.fail(.streamEnded)])
        var early = ReplicationStateMachine(settings: Self.settings)
        _ = early.start()
        #expect(
            early.received(.copyData(ByteBuffer()), now: .now()) == [
                .fail(.protocolViolation("an unexpected message (CopyData)"))
            ])
    }

    @Test func aFatalErrorStopsTheFeedAndAnyOtherReconnects() {
        func error(_ state: String) -> ReplicationStateMachine.Failure {
            .server(PostgresServerError(fields: [UInt8(ascii: "C"): state, UInt8(ascii: "M"): "x"]))
        }
        #expect(PostgresChangeSource.classify(error("28P01")) is PostgresChangeSource.StreamStop)
        #expect(PostgresChangeSource.classify(error("42704")) is PostgresChangeSource.StreamStop)
        #expect(PostgresChangeSource.classify(error("55006")) is PostgresChangeSource.ConnectionLost)
        #expect(PostgresChangeSource.classify(error("57P01")) is PostgresChangeSource.ConnectionLost)
        #expect(PostgresChangeSource.classify(.streamEnded) is PostgresChangeSource.ConnectionLost)
    }
}

/// The bytes of the messages.
@Suite struct PostgresMessageTests {
    static func decode(_ bytes: [UInt8], max: Int = 1 << 20) throws -> [PostgresBackendMessage] {
        var decoder = PostgresBackendDecoder(maxMessageSize: max)
        var buffer = ByteBuffer(bytes: bytes)
        var messages: [PostgresBackendMessage] = []
        while let message = try decoder.decode(buffer: &buffer) { messages.append(message) }
        return messages
    }

    @Test func messagesSplitAnywhere() throws {
        // AuthenticationSASL with one mechanism, an ErrorResponse, ReadyForQuery.
        var bytes: [UInt8] = [UInt8(ascii: "R"), 0, 0, 0, 23, 0, 0, 0, 10] + Array("SCRAM-SHA-256".utf8) + [0, 0]
        bytes +=
            [UInt8(ascii: "E"), 0, 0, 0, 21, UInt8(ascii: "C")] + Array("28P01".utf8) + [0, UInt8(ascii: "M")]
            + Array("refused".utf8) + [0, 0]
        bytes += [UInt8(ascii: "Z"), 0, 0, 0, 5, UInt8(ascii: "I")]
        let whole = try Self.decode(bytes)
        try #require(whole.count == 3)
        #expect(whole[0] == .authentication(.sasl(mechanisms: ["SCRAM-SHA-256"])))
        guard case .error(let error) = whole[1] else {
            Issue.record("no error")
            return
        }
        #expect(error.sqlState == "28P01" && error.message == "refused")
        #expect(whole[2] == .readyForQuery)
        // Fed a byte at a time, the same messages.
        var decoder = PostgresBackendDecoder()
        var buffer = ByteBuffer()
        var split: [PostgresBackendMessage] = []
        for byte in bytes {
            buffer.writeInteger(byte)
            while let message = try decoder.decode(buffer: &buffer) { split.append(message) }
        }
        #expect(split == whole)
    }

    @Test func anOversizedMessageIsRefusedBeforeItIsRead() {
        #expect(throws: PostgresProtocolError.self) {
            try Self.decode([UInt8(ascii: "d"), 0x7F, 0, 0, 0], max: 1 << 20)
        }
        #expect(throws: PostgresProtocolError.self) { try Self.decode([UInt8(ascii: "d"), 0, 0, 0, 3]) }
    }

    @Test func frontendBytes() {
        var buffer = ByteBuffer()
        PostgresFrontendMessage.sslRequest.encode(into: &buffer)
        #expect(Array(buffer.readableBytesView) == [0, 0, 0, 8, 4, 210, 22, 47])
        buffer.clear()
        PostgresFrontendMessage.startup(parameters: ["user": "u"]).encode(into: &buffer)
        #expect(Array(buffer.readableBytesView) == [0, 0, 0, 16, 0, 3, 0, 0, 117, 115, 101, 114, 0, 117, 0, 0])
        buffer.clear()
        PostgresFrontendMessage.query("X").encode(into: &buffer)
        #expect(Array(buffer.readableBytesView) == [81, 0, 0, 0, 6, 88, 0])
        buffer.clear()
        PostgresFrontendMessage.saslInitialResponse(mechanism: "M", data: [1]).encode(into: &buffer)
        #expect(Array(buffer.readableBytesView) == [112, 0, 0, 0, 11, 77, 0, 0, 0, 0, 1, 1])
    }
}

/// The socket's setup, against a server that takes the connection and says nothing.
@Suite struct ReplicationChannelTests {
    @Test(.timeLimit(.minutes(1))) func aServerThatNeverAnswersTheSSLRequestIsGivenUpInTime() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0).get()
        defer { server.close(promise: nil) }
        let port = server.localAddress!.port!
        let dsn = try PostgresDSN("postgres://relay@127.0.0.1:\(port)/app?sslmode=require")
        let started = NIODeadline.now()
        await #expect(throws: (any Error).self) {
            _ = try await ReplicationChannel.connect(
                dsn: dsn, timeout: .milliseconds(300), on: group.next(), maxMessageSize: 1 << 20)
        }
        #expect(NIODeadline.now() - started < .seconds(10))
    }
}
