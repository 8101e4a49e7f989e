import Bayeux
import Foundation
import JWTKit
import NIOCore
import NIOPosix
import Testing

@testable import PubSubAuth
@testable import PubSubCore

/// Real tokens signed by jwt-kit (and one forged by hand), verified by `JWTAuthorizer`.
@Suite struct JWTAuthorizerTests {
    static let secret = "s3cret-for-tests-0123456789abcdefghij"
    let loop = MultiThreadedEventLoopGroup.singleton.next()

    static func hs256(_ claims: JWTClaims, secret: String = secret) async throws -> String {
        try await JWTKeyCollection().add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256).sign(claims)
    }

    static func base64URL(_ text: String) -> String {
        Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    @Test func signatureAndAlgorithmChecks() async throws {
        let now = 1_000_000.0
        let es = ES256PrivateKey()
        let other = ES256PrivateKey()
        let jwt = try await JWTAuthorizer.make(
            hmacSecret: Self.secret, publicKeyPEM: es.publicKey.pemRepresentation, now: { now })
        #expect(Set(jwt.algorithms) == [.hs256, .es256])
        let claims = JWTClaims(sub: "42", exp: now + 60)
        #expect(await jwt.verify(try await Self.hs256(claims)) == claims)
        #expect(await jwt.verify(try await JWTKeyCollection().add(ecdsa: es).sign(claims)) == claims)
        // Wrong secret, wrong EC key.
        #expect(await jwt.verify(try await Self.hs256(claims, secret: "another-secret-that-is-32-bytes-long!!")) == nil)
        #expect(await jwt.verify(try await JWTKeyCollection().add(ecdsa: other).sign(claims)) == nil)
        // alg none, with and without a signature part.
        let payload = Self.base64URL(#"{"sub":"42","exp":\#(Int(now) + 60)}"#)
        let none = Self.base64URL(#"{"alg":"none","typ":"JWT"}"#) + "." + payload
        #expect(await jwt.verify(none + ".") == nil)
        #expect(await jwt.verify(none) == nil)
        // Garbage.
        #expect(await jwt.verify("not.a.token") == nil)
        #expect(await jwt.verify("") == nil)
    }

    @Test func anHS256TokenNeverMeetsAPublicKey() async throws {
        let es = ES256PrivateKey()
        let pem = es.publicKey.pemRepresentation
        let jwt = try await JWTAuthorizer.make(hmacSecret: nil, publicKeyPEM: pem)
        #expect(jwt.algorithms == [.es256])
        // The public key's PEM used as an HMAC secret: the confusion attack.
        let forged = try await Self.hs256(JWTClaims(sub: "admin"), secret: pem)
        #expect(await jwt.verify(forged) == nil)
    }

    @Test func keysThatAreNotKeysAreRefused() async throws {
        await #expect(throws: JWTAuthorizer.KeyError.self) {
            try await JWTAuthorizer.make(
                hmacSecret: nil, publicKeyPEM: "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
        }
        await #expect(throws: JWTAuthorizer.KeyError.self) {
            try await JWTAuthorizer.make(hmacSecret: "short", publicKeyPEM: nil)
        }
    }

    func ask(
        _ jwt: JWTAuthorizer, _ action: AuthorizationAction, channel: String? = nil, ext: JSONObject?,
        user: String? = nil, grant: SessionGrant? = nil
    ) async throws -> AuthorizationDecision {
        var message = Message()
        message.ext = ext
        let request = AuthorizationRequest(
            action: action, clientId: "c1", channel: channel, message: message, user: user, grant: grant,
            context: RequestContext(connectionType: .websocket))
        return try await jwt.authorize(request, on: loop).get()
    }

    @Test func decisionsByActionCarryFayeErrors() async throws {
        let now = 1_000_000.0
        let jwt = try await JWTAuthorizer.make(hmacSecret: Self.secret, publicKeyPEM: nil, now: { now })
        let connection = try await Self.hs256(
            JWTClaims(sub: "42", exp: now + 60, channels: ["/jobs/42"], publish: ["/chat/**"]))
        let grant = SessionGrant(user: "42", expiresAt: now + 60, channels: ["/jobs/42"], publish: ["/chat/**"])
        #expect(try await ask(jwt, .handshake, ext: ["token": .string(connection)]) == .allow(user: "42", grant: grant))
        #expect(try await ask(jwt, .handshake, ext: nil) == .abstain("401::Invalid token"))
        #expect(try await ask(jwt, .handshake, ext: ["token": "x.y.z"]) == .deny("401::Invalid token"))
        #expect(try await ask(jwt, .handshake, ext: ["token": 5]) == .deny("401::Invalid token"))
        let expired = try await Self.hs256(JWTClaims(sub: "42", exp: now - 1))
        #expect(try await ask(jwt, .handshake, ext: ["token": .string(expired)]) == .deny("401::Token expired"))
        let early = try await Self.hs256(JWTClaims(sub: "42", nbf: now + 30))
        #expect(try await ask(jwt, .handshake, ext: ["token": .string(early)]) == .deny("401::Token not yet valid"))

        #expect(try await ask(jwt, .subscribe, channel: "/jobs/42", ext: nil, grant: grant) == .allow())
        #expect(
            try await ask(jwt, .subscribe, channel: "/jobs/43", ext: nil, grant: grant)
                == .abstain("403:/jobs/43:No token grants this channel"))
        let sub43 = try await Self.hs256(JWTClaims(sub: "42", exp: now + 60, channel: "/jobs/43"))
        #expect(
            try await ask(jwt, .subscribe, channel: "/jobs/43", ext: ["token": .string(sub43)], user: "42") == .allow())
        #expect(
            try await ask(jwt, .subscribe, channel: "/jobs/43", ext: ["token": .string(sub43)], user: "7")
                == .deny("403:/jobs/43:Token is for another user"))
        #expect(
            try await ask(jwt, .subscribe, channel: "/jobs/44", ext: ["token": .string(sub43)], user: "42")
                == .deny("403:/jobs/44:Token is for another channel"))

        #expect(try await ask(jwt, .publish, channel: "/chat/a", ext: nil, grant: grant) == .allow())
        #expect(
            try await ask(jwt, .publish, channel: "/jobs/42", ext: nil, grant: grant)
                == .abstain("403:/jobs/42:No token grants this channel"))
        // A back end without a session publishes with a token of its own.
        #expect(try await ask(jwt, .publish, channel: "/chat/a", ext: ["token": .string(connection)]) == .allow())
        #expect(
            try await ask(jwt, .publish, channel: "/jobs/1", ext: ["token": .string(connection)])
                == .deny("403:/jobs/1:No token grants this channel"))
    }

    @Test func aPublishedTokenIsNotDelivered() {
        var message = Message()
        message.ext = ["token": "abc", "keep": 1]
        JWTAuthorizer(keys: [:], now: { 0 }).scrub(&message)
        #expect(message.ext == ["keep": 1])
    }
}
