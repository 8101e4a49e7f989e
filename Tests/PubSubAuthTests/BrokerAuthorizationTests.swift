import Bayeux
import JWTKit
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

@testable import PubSubAuth
@testable import PubSubCore

/// Modes combined in a real `Broker` over the memory engine: PrivatePub signatures, public patterns and JWT.
@Suite struct BrokerAuthorizationTests {
    static let secret = "pp-secret"
    static let jwtSecret = "jwt-secret-0123456789abcdefghijklmnop"
    let loop = MultiThreadedEventLoopGroup.singleton.next()

    final class Clock: Sendable {
        let seconds = NIOLockedValueBox(1_000_000.0)
        var now: Double { seconds.withLockedValue { $0 } }
        func advance(_ by: Double) { seconds.withLockedValue { $0 += by } }
    }

    /// A broker with every mode but the hook; brokers given the same engine are nodes sharing their sessions.
    func broker(clock: Clock, engine: (any Engine)? = nil) async throws -> Broker {
        let jwt = try await JWTAuthorizer.make(hmacSecret: Self.jwtSecret, publicKeyPEM: nil, now: { clock.now })
        let pipeline = AuthorizationPipeline(
            [PrivatePubAuth(secret: Self.secret), PublicChannels(["/news/**"]), jwt], wallClock: { clock.now })
        return Broker(engine: engine, extensions: ExtensionPipeline([], authorization: pipeline))
    }

    func send(_ broker: Broker, _ json: String) async throws -> Message {
        var message = Message(try #require(JSONParser().parse(json).objectValue))
        if message.channel == Channel.connect { message["connectionType"] = "long-polling" }
        let outcomes = try await broker.handle(
            [.message(message)], context: RequestContext(connectionType: .longPolling), sink: nil, now: .now(), on: loop
        ).get()
        switch outcomes.first {
        case .reply(let reply)?: return reply
        case .connect(let pending)?: return pending.reply
        default:
            Issue.record("no reply")
            return Message()
        }
    }

    func token(_ claims: JWTClaims) async throws -> String {
        try await JWTKeyCollection().add(hmac: HMACKey(from: Self.jwtSecret), digestAlgorithm: .sha256).sign(claims)
    }

    func handshake(_ broker: Broker, token: String?) async throws -> Message {
        let ext = token.map { #","ext":{"token":"\#($0)"}"# } ?? ""
        return try await send(
            broker, #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]\#(ext)}"#
        )
    }

    @Test func anyModeAcceptsAndTheJWTUserIsTheSessionsUser() async throws {
        let clock = Clock()
        let broker = try await broker(clock: clock)
        let connection = try await token(
            JWTClaims(sub: "42", exp: clock.now + 60, channels: ["/jobs/42"], publish: ["/jobs/42"]))
        let hello = try await handshake(broker, token: connection)
        let cid = try #require(hello.clientId)
        #expect(try await broker.engine.user(of: cid, on: loop).get() == "42")

        func subscribe(_ channel: String, ext: String = "{}") async throws -> Message {
            try await send(
                broker,
                #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"\#(channel)","ext":\#(ext)}"#)
        }
        // JWT claims, a public pattern, a PrivatePub signature: each accepts on its own.
        #expect(try await subscribe("/jobs/42")["successful"] == true)
        #expect(try await subscribe("/news/today")["successful"] == true)
        let ts = "\(PrivatePubAuth.wallClockMilliseconds())"
        let signature = PrivatePubAuth.signature(secret: Self.secret, channel: "/jobs/99", timestamp: ts)
        #expect(
            try await subscribe(
                "/jobs/99", ext: #"{"private_pub_signature":"\#(signature)","private_pub_timestamp":"\#(ts)"}"#)[
                    "successful"] == true)
        // None accepts: PrivatePub's text, as before JWT existed.
        let refused = try await subscribe("/jobs/43")
        #expect(refused["successful"] == false && refused.error == "Incorrect signature.")
        // A subscription token that is wrong says why, over the abstentions.
        let other = try await token(JWTClaims(sub: "7", exp: clock.now + 60, channel: "/jobs/43"))
        #expect(
            try await subscribe("/jobs/43", ext: #"{"token":"\#(other)"}"#).error
                == "403:/jobs/43:Token is for another user")
        let mine = try await token(JWTClaims(sub: "42", exp: clock.now + 60, channel: "/jobs/43"))
        #expect(try await subscribe("/jobs/43", ext: #"{"token":"\#(mine)"}"#)["successful"] == true)
        // A subscribe naming several channels is refused whole when one is refused.
        let several = try await send(
            broker, #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":["/news/a","/jobs/500"]}"#)
        #expect(several["successful"] == false)

        // Publishing: the token's publish claim, or PrivatePub's token (which is then not delivered).
        #expect(try await send(broker, #"{"channel":"/jobs/42","clientId":"\#(cid)","data":1}"#)["successful"] == true)
        #expect(
            try await send(broker, #"{"channel":"/jobs/7","clientId":"\#(cid)","data":1}"#).error == "Incorrect token.")
        #expect(
            try await send(broker, #"{"channel":"/jobs/7","data":1,"ext":{"private_pub_token":"\#(Self.secret)"}}"#)[
                "successful"] == true)
    }

    @Test func anExpiredConnectionTokenEndsTheSessionAtTheNextConnect() async throws {
        let clock = Clock()
        let broker = try await broker(clock: clock)
        let connection = try await token(JWTClaims(sub: "42", exp: clock.now + 30, channels: ["/jobs/42"]))
        let cid = try #require(try await handshake(broker, token: connection).clientId)
        #expect(try await send(broker, #"{"channel":"/meta/connect","clientId":"\#(cid)"}"#)["successful"] == true)
        clock.advance(31)
        // Claims stop granting at once; the next connect is told to handshake again.
        #expect(
            try await send(broker, #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"/jobs/42"}"#)[
                "successful"] == false)
        let connect = try await send(broker, #"{"channel":"/meta/connect","clientId":"\#(cid)"}"#)
        #expect(connect.error == "401:\(cid):Token expired")
        #expect(connect["advice"]?.objectValue?["reconnect"] == "handshake")
        #expect(try await broker.engine.clientExists(cid, on: loop).get() == false)
    }

    @Test func aBadTokenRefusesTheHandshakeButNoTokenDoesNot() async throws {
        let clock = Clock()
        let broker = try await broker(clock: clock)
        let bad = try await handshake(broker, token: "e30.e30.")
        #expect(bad["successful"] == false && bad.error == "401::Invalid token" && bad.clientId == nil)
        let expired = try await handshake(broker, token: try await token(JWTClaims(sub: "42", exp: clock.now - 1)))
        #expect(expired.error == "401::Token expired")
        let anonymous = try await handshake(broker, token: nil)
        let cid = try #require(anonymous.clientId)
        #expect(try await broker.engine.user(of: cid, on: loop).get() == nil)
    }

    @Test func anotherNodeEnforcesTheGrantItReadsFromTheEngine() async throws {
        let clock = Clock()
        let a = try await broker(clock: clock)
        let b = try await broker(clock: clock, engine: a.engine)
        let connection = try await token(JWTClaims(sub: "42", exp: clock.now + 30, channels: ["/jobs/42"]))
        let cid = try #require(try await handshake(a, token: connection).clientId)
        #expect(b.extensions.authorization.grants.lookup(cid) == nil)  // b has not seen this session yet
        #expect(
            try await send(b, #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"/jobs/42"}"#)[
                "successful"] == true)
        #expect(
            try await send(b, #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"/jobs/43"}"#)[
                "successful"] == false)
        clock.advance(31)
        let connect = try await send(b, #"{"channel":"/meta/connect","clientId":"\#(cid)"}"#)
        #expect(connect.error == "401:\(cid):Token expired")
    }

    @Test func grantsSurviveTheirEncoding() {
        let grants = [
            SessionGrant(
                user: "42", expiresAt: 1_700_000_000, channels: ["/jobs/42", "/users/42/**"], publish: ["/a"]),
            SessionGrant(user: "ü \"quoted\"", expiresAt: 1_700_000_000.5),
            SessionGrant(user: "x"),
        ]
        for grant in grants { #expect(SessionGrant(encoded: grant.encoded) == grant) }
        #expect(SessionGrant(encoded: "garbage") == nil)
        #expect(SessionGrant(encoded: #"{"exp":1}"#) == nil)
    }

    @Test func theServersOwnPublishesAreNotAsked() async throws {
        let broker = try await broker(clock: Clock())
        var message = Message()
        message.channel = "/jobs/1"
        message["data"] = 1
        message.ext = ["private_pub_token": "wrong"]
        let outcomes = try await broker.handle(
            [.message(message)], context: RequestContext(connectionType: .inProcess), sink: nil, now: .now(), on: loop
        ).get()
        guard case .reply(let reply)? = outcomes.first else {
            Issue.record("no reply")
            return
        }
        #expect(reply["successful"] == true)
        // Over HTTP the same publish is refused.
        #expect(
            try await send(broker, #"{"channel":"/jobs/1","data":1,"ext":{"private_pub_token":"wrong"}}"#).error
                == "Incorrect token.")
    }
}
