import Bayeux
import Foundation
import JWTKit
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import PubSubTesting
import Testing

@testable import PubSubAuth
@testable import PubSubCore

/// `JWKSKeySource` with a fake provider (a closure counting its calls) and a clock the test moves: rotation, the
/// unknown-kid refetch and its rate limit, failures that keep the keys, fail closed, and how a JWKS combines
/// with `--jwt-key` in `JWTAuthorizer`. The same against a real HTTP server: Tests/auth/test_jwks.py.
@Suite struct JWKSKeySourceTests {
    /// A fixed RSA key (generating one per test is slow in debug builds).
    static let rsaPEM = """
        -----BEGIN PRIVATE KEY-----
        MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCn3Zm3bPbpscAR
        kCRJ0ZH7+btH0lQO7i+ULnoNO4OcxKwqZ6cc31oe5Peo1FGHZ5LCmkY5IOFdPsg3
        kc3QpOcF/ly6qnNEroVVJr949lqwLbm+GvikmC7vKXtte9VA/iWzFPp5xNrf2mG8
        5WMog565tqI49Jj57vPpkMse3zq0OPCm5jXTbwCArWPZxjUnGLFZpYQ9hWdqW3cM
        h4n0tWA/lSerXjh9m4aO1dbaJh6OKKJFgUM4pwB41W60hRIwax63xjRJovyX4OHF
        JIoKxNgG2pULGihgYKSFv531KJjrxzcQIdgzrznwEp+6g6ZHvhXM+5slc+LQjQ8B
        m3fFPNzfAgMBAAECggEAOHGqcMNaaO0EVMN/eDTYHf50ayt9aUHMzMot7woecJWv
        AFk3F13Ay1eZMPMncNyyO+4tA6ObM8PbBdhoeKoiJmFHo9qRhLwcCCxNwKoxh0Dw
        zkv6ZDnpujBcGM3FQKPUYFmC+XPoVtHzAFWvWF2dfvu6o2UXlR60dEpkCj7sWdGp
        UJKCtWh+gljHnotTlNbcpF+NXQOO9tYL83sasW58VU7jTkDDn136yPe3uO/JJqzC
        DShWK4Lp5yvuxsVcz48P+cOZvwmhC8953qjyMwumXLRUlkRdIaZkdBHES37piwwt
        dmrAj/Zwhy3Y4OpTqhwYjgnJlawJDzJwaFxLSPTP5QKBgQDnpFagPpkYDU9dkk3Y
        mdBUodD1eFzc88foPL9QhSwy4m5zU3o1QOdPN5TncqXFeWAeCnTmlnjYL1PUm3Wg
        p4K8RNfQFCSCYgyoQGOaHgSNkfBaeeTk4L39w9PHgyqbf9vHYjI/gC6sbuEAmT86
        JlWcQ1I24Z2MaOJCIdWwSfZN8wKBgQC5hHEk7nEPnpjQLjEnMs82rNmS0uEJtlM2
        mNIvGhQV4d+2CyizPAjopzDZXuYYYVjE5HG2GrNphZvzOkcclHZhPidleT8SAXP+
        D4uQaj2d+UEt50kT6jFdu6DGgmeZtmlk+SL8JBbTYsmc9dcX0Hx6O7ODt/7Bqa/n
        n/IpHsp0ZQKBgQCqDKOnSaz70jGUQKYzP1+H8a7DtVN+xNvZalcMFmeHB2EL+pk5
        ZOcp6WS/sBNv75WXGBgPeyFFmyDQcDue77ny2hsQXukaaj5eeb5k0mqHPz6SPO/C
        8hWnqE3dJjZuJyPBsB2xLjmVTmSRGu8mkiPA7k75iREulYScBdiobPOK7wKBgA9J
        MmlwnDBFSSIeLD6mmRxQMb0/UvuR4lllTixDYdRLwDsnwDrEf5dr70J550uq+b1/
        dT8kBBR1xdvMuX9JXFe231glHWVGaWBNt5o2ps0VdKFrpUHW0ip/A0hYBmFL/nMr
        dA6Cir7wLNyaBRcZPqhzst7vkjYy3SOgsjthJh1hAoGBAKhe6wWe+zBcu+uEhl+4
        XwcZXExT136PjmpyWwBjMcXDFogqFJQ8IEGaCOe1T5Y8MKJc/X2BNIQi4KrQe6aw
        1b7z3ITLiMF6udgJze8hbTJaxsTSo4RekGeWq5zpXC4s+KdIAzvaWISeTKbcedgU
        0xXCUZsGncd8f6dEryQtIrOR
        -----END PRIVATE KEY-----
        """

    /// What the fake provider answers, and how many times it was asked.
    final class Provider: Sendable {
        enum Answer: Sendable {
            case body(String)
            case failure(JWKSFailure)
        }
        private let state = NIOLockedValueBox<(answer: Answer, calls: Int)>(
            (.failure(JWKSFailure(.unreachable, "down")), 0))

        var calls: Int { state.withLockedValue { $0.calls } }
        func answer(_ answer: Answer) { state.withLockedValue { $0.answer = answer } }
        func keys(_ keys: [String]) { answer(.body(#"{"keys":["# + keys.joined(separator: ",") + "]}")) }

        func fetch() throws -> ByteBuffer {
            let answer = state.withLockedValue { state -> Answer in
                state.calls += 1
                return state.answer
            }
            switch answer {
            case .body(let text): return ByteBuffer(string: text)
            case .failure(let failure): throw failure
            }
        }
    }

    final class Clock: Sendable {
        private let now = NIOLockedValueBox(1000.0)
        func callAsFunction() -> Double { now.withLockedValue { $0 } }
        func advance(_ seconds: Double) { now.withLockedValue { $0 += seconds } }
    }

    /// An ES256 signer and its public JWK.
    struct ECKey {
        let kid: String
        let key = ES256PrivateKey()

        func jwk(alg: String? = "ES256", use: String? = "sig") -> String {
            let (x, y) = key.publicKey.parameters!
            var fields = [#""kty":"EC""#, #""crv":"P-256""#, #""kid":"\#(kid)""#, #""x":"\#(x)""#, #""y":"\#(y)""#]
            if let alg { fields.append(#""alg":"\#(alg)""#) }
            if let use { fields.append(#""use":"\#(use)""#) }
            return "{" + fields.joined(separator: ",") + "}"
        }

        func sign(_ claims: JWTClaims, kid: String? = nil) async throws -> String {
            let kid = JWKIdentifier(string: kid ?? self.kid)
            return try await JWTKeyCollection().add(ecdsa: key, kid: kid).sign(claims, kid: kid)
        }
    }

    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func rsaJWK(kid: String, alg: String? = nil) throws -> String {
        let (n, e) = try Insecure.RSA.PrivateKey(pem: rsaPEM).publicKey.getKeyPrimitives()
        let algField = alg.map { #","alg":"\#($0)""# } ?? ""
        return #"{"kty":"RSA","kid":"\#(kid)","n":"\#(base64URL(n))","e":"\#(base64URL(e))"\#(algField)}"#
    }

    static func rs256(_ claims: JWTClaims, kid: String) async throws -> String {
        let id = JWKIdentifier(string: kid)
        return try await JWTKeyCollection().add(
            rsa: Insecure.RSA.PrivateKey(pem: rsaPEM), digestAlgorithm: .sha256, kid: id
        )
        .sign(claims, kid: id)
    }

    let provider = Provider()
    let clock = Clock()
    let claims = JWTClaims(sub: "42", channels: ["/jobs/42"])

    func source(refresh: Double = 300) -> JWKSKeySource {
        let provider = self.provider
        let clock = self.clock
        return JWKSKeySource(
            settings: JWKSSettings(url: "https://idp.example/jwks", refreshInterval: refresh),
            fetcher: { try provider.fetch() }, clock: { clock() })
    }

    func authorizer(_ source: JWKSKeySource, hmacSecret: String? = nil) async throws -> JWTAuthorizer {
        try await JWTAuthorizer.make(hmacSecret: hmacSecret, publicKeyPEM: nil, jwks: source, now: { 1_000_000 })
    }

    @Test func keysOfTheSetVerifyTokensByKid() async throws {
        let a = ECKey(kid: "a")
        let b = ECKey(kid: "b")
        provider.keys([a.jwk(), b.jwk(alg: nil, use: nil), try Self.rsaJWK(kid: "r")])
        let source = source()
        await source.refreshIfDue()
        #expect(source.keys?.kids == [.es256: ["a", "b"], .rs256: ["r"]])
        let jwt = try await authorizer(source)
        #expect(jwt.algorithms == [.rs256, .es256])
        #expect(await jwt.verify(try await a.sign(claims)) == claims)
        #expect(await jwt.verify(try await b.sign(claims)) == claims)
        #expect(await jwt.verify(try await Self.rs256(claims, kid: "r")) == claims)
        // The right kid on a token another key signed; a kid the token's algorithm has no key for.
        #expect(await jwt.verify(try await ECKey(kid: "a").sign(claims)) == nil)
        #expect(await jwt.verify(try await a.sign(claims, kid: "r")) == nil)
        #expect(provider.calls == 1 + 1)  // the start, then one refetch for that last unknown kid
    }

    @Test func rotationDropsOldKeysAtTheNextRefreshAndANewKidIsFetched() async throws {
        let old = ECKey(kid: "old")
        let new = ECKey(kid: "new")
        provider.keys([old.jwk()])
        let source = source(refresh: 60)
        await source.refreshIfDue()
        let jwt = try await authorizer(source)
        #expect(await jwt.verify(try await old.sign(claims)) == claims)
        // The provider publishes the next key: a token signed with it is accepted at once (one refetch).
        provider.keys([old.jwk(), new.jwk()])
        #expect(await jwt.verify(try await new.sign(claims)) == claims)
        #expect(provider.calls == 2)
        // The provider drops the old key: still held until the schedule's next fetch, refused after it.
        provider.keys([new.jwk()])
        clock.advance(30)
        #expect(await jwt.verify(try await old.sign(claims)) == claims)
        clock.advance(31)
        #expect(await jwt.verify(try await old.sign(claims)) == nil)
        #expect(provider.calls == 3)
        #expect(await jwt.verify(try await new.sign(claims)) == claims)
        #expect(source.keys?.kids == [.es256: ["new"]])
    }

    @Test func aFloodOfForgedKidsCostsOneFetchPerInterval() async throws {
        let a = ECKey(kid: "a")
        provider.keys([a.jwk()])
        let source = source()
        await source.refreshIfDue()
        let jwt = try await authorizer(source)
        let forger = ECKey(kid: "x")
        let forged = try await forger.sign(claims)
        await withTaskGroup(of: JWTClaims?.self) { group in
            for _ in 0..<200 { group.addTask { await jwt.verify(forged) } }
            for await result in group { #expect(result == nil) }
        }
        #expect(provider.calls == 2)
        clock.advance(9.9)
        for kid in ["y", "z"] { #expect(await jwt.verify(try await forger.sign(claims, kid: kid)) == nil) }
        #expect(provider.calls == 2)
        clock.advance(0.1)
        #expect(await jwt.verify(forged) == nil)
        #expect(provider.calls == 3)
        #expect(await jwt.verify(try await a.sign(claims)) == claims)
    }

    @Test(arguments: [
        JWKSKeySourceTests.Provider.Answer.failure(JWKSFailure(.unreachable, "connection refused")),
        .failure(JWKSFailure(.status, "HTTP 503")),
        .body("<html>not json</html>"),
        .body(#"{"keys":"no"}"#),
        .body(#"{"keys":[]}"#),
        .body(#"{"keys":[{"kty":"oct","kid":"h","k":"c2VjcmV0"}]}"#),
    ])
    func aProviderDownOrAnsweringGarbageKeepsTheLastKeys(_ answer: Provider.Answer) async throws {
        let a = ECKey(kid: "a")
        provider.keys([a.jwk()])
        let source = source(refresh: 60)
        await source.refreshIfDue()
        let jwt = try await authorizer(source)
        provider.answer(answer)
        clock.advance(60)
        #expect(await jwt.verify(try await a.sign(claims)) == claims)
        #expect(provider.calls == 2)
        #expect(source.refreshState.consecutiveFailures == 1)
        #expect(source.keys?.kids == [.es256: ["a"]])
        // Retried on the schedule's shorter retry interval, not at every token.
        clock.advance(10)
        #expect(await jwt.verify(try await a.sign(claims)) == claims)
        #expect(provider.calls == 2)
        clock.advance(20)
        #expect(await jwt.verify(try await a.sign(claims)) == claims)
        #expect(provider.calls == 3)
    }

    @Test func withoutEverAGoodSetEveryTokenIsRefusedUntilOneArrives() async throws {
        let a = ECKey(kid: "a")
        provider.answer(.body("garbage"))
        let source = source()
        await source.refreshIfDue()
        #expect(source.keys == nil)
        let jwt = try await authorizer(source)
        #expect(await jwt.verify(try await a.sign(claims)) == nil)
        #expect(provider.calls == 2)  // the start, one unknown-kid refetch
        let token = try await a.sign(JWTClaims(sub: "42", exp: 2_000_000, channels: ["/jobs/42"]))
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        var message = Message()
        message.ext = ["token": .string(token)]
        let request = AuthorizationRequest(
            action: .handshake, clientId: nil, channel: nil, message: message,
            context: RequestContext(connectionType: .websocket))
        // The same refusal as any token that does not verify.
        #expect(try await jwt.authorize(request, on: loop).get() == .deny("401::Invalid token"))
        // The provider comes back: the next unknown-kid refetch (after the interval) brings the keys.
        provider.keys([a.jwk()])
        clock.advance(10)
        #expect(await jwt.verify(try await a.sign(claims)) == claims)
    }

    @Test func jwksBesideAnHMACKey() async throws {
        let secret = "s3cret-for-tests-0123456789abcdefghij"
        let a = ECKey(kid: "a")
        provider.keys([a.jwk()])
        let source = source()
        await source.refreshIfDue()
        let jwt = try await authorizer(source, hmacSecret: secret)
        #expect(jwt.algorithms == [.hs256, .rs256, .es256])
        let hs = await JWTKeyCollection().add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256, kid: "a")
        #expect(await jwt.verify(try await hs.sign(claims, kid: "a")) == claims)
        #expect(await jwt.verify(try await a.sign(claims)) == claims)
        // An HS256 token never reaches the JWKS: no refetch for its kid, whatever it names.
        let wrong = await JWTKeyCollection().add(
            hmac: HMACKey(from: "another-secret-that-is-32-bytes-long!!"), digestAlgorithm: .sha256, kid: "zz")
        #expect(await jwt.verify(try await wrong.sign(claims, kid: "zz")) == nil)
        #expect(provider.calls == 1)
    }

    @Test func aKeyIsBoundToOneAlgorithmWhenItIsRead() async throws {
        // An RSA key without alg is read as an RS256 key at once (jwt-kit would bind it to the algorithm of the
        // first token it meets): a PS256 token signed with the same key is refused, RS256 tokens work after it.
        provider.keys([try Self.rsaJWK(kid: "r")])
        let source = source()
        await source.refreshIfDue()
        let jwt = try await authorizer(source)
        let ps = try await JWTKeyCollection().add(
            pss: Insecure.RSA.PrivateKey(pem: Self.rsaPEM), digestAlgorithm: .sha256, kid: "r")
        #expect(await jwt.verify(try await ps.sign(claims, kid: "r")) == nil)
        #expect(await jwt.verify(try await Self.rs256(claims, kid: "r")) == claims)
    }

    @Test func keysPubsubCannotUseAreSkipped() async throws {
        let a = ECKey(kid: "a")
        let body = ByteBuffer(
            string: #"{"keys":["#
                + [
                    a.jwk(use: "enc"),  // an encryption key
                    ECKey(kid: "").jwk(),  // no kid
                    ECKey(kid: "b").jwk(alg: "ES384"),  // another algorithm
                    try Self.rsaJWK(kid: "r", alg: "RS512"),
                    #"{"kty":"oct","kid":"h","k":"c2VjcmV0"}"#,
                    #"{"kty":"OKP","crv":"Ed25519","kid":"ed","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}"#,
                    #"{"kty":"RSA","kid":"bad","n":"AQAB","e":"AQAB"}"#,
                    #"{"kty":"EC","crv":"P-256","kid":"off","x":"AA","y":"AA"}"#,
                    "42",
                    ECKey(kid: "good").jwk(alg: nil, use: nil),
                ].joined(separator: ",") + "]}")
        let keys = try await JWKSKeySet.parse(body)
        #expect(keys.kids == [.es256: ["good"]])
        await #expect(throws: JWKSFailure(.noKeys, "no RS256 or ES256 signing key with a kid among 1 key(s)")) {
            try await JWKSKeySet.parse(ByteBuffer(string: #"{"keys":[\#(a.jwk(use: "enc"))]}"#))
        }
        for garbage in ["", "null", "[]", #"{"keys":{}}"#, "<html>"] {
            await #expect(throws: JWKSFailure.self) { try await JWKSKeySet.parse(ByteBuffer(string: garbage)) }
        }
    }

    @Test func theRefreshServiceFetchesOnTimeAndStopsWhenCancelled() async throws {
        let a = ECKey(kid: "a")
        provider.keys([a.jwk()])
        // A real clock here: the service sleeps until the next fetch is due.
        let provider = self.provider
        let source = JWKSKeySource(
            settings: JWKSSettings(url: "https://idp.example/jwks", refreshInterval: 0.2),
            fetcher: { try provider.fetch() })
        let running = Task { await source.run() }
        // Fetches again and again (however loaded the machine: waited for, not timed), then stops when cancelled.
        let fetched = try await waitUntil(timeout: .seconds(30)) { provider.calls >= 3 }
        #expect(fetched, "fetched \(provider.calls) times with a 0.2 s refresh")
        running.cancel()
        await running.value
        let calls = provider.calls
        try await Task.sleep(nanoseconds: 500_000_000)  // a quiet window: no fetch after the cancellation
        #expect(provider.calls == calls)
    }
}
