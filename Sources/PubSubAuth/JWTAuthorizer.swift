import Bayeux
import JWTKit
import NIOCore
import PubSubCore

/// JWT as an authorization mode, verified by jwt-kit.
///
/// - Handshake: `ext.token` is a connection token (`sub` required; `exp`, `nbf`, `channels`, `publish`). A valid
///   one makes `sub` the session's user and its claims the session's grant; an invalid one refuses the
///   handshake (`401::Invalid token`). A handshake without a token is not refused by this mode (other modes may
///   serve that client), but the session then has nothing granted by JWT.
/// - Subscribe: `ext.token` is a subscription token (`sub` = the session's user, `channel` = the subscription,
///   `exp`); without one, the connection token's `channels` must cover the subscription.
/// - Publish: the connection token's `publish` patterns must cover the channel; a client without a session (a
///   back end publishing over HTTP) may instead carry a token with `sub` and `publish` in `ext.token`.
///
/// Each algorithm has its own key set and a token is checked only by the set of the algorithm its header names,
/// among HS256, RS256 and ES256: `alg: none` and every other algorithm are refused, and an RS256 key never
/// verifies an HS256 token (the public key used as an HMAC secret), because HS256 tokens only meet the HMAC key.
///
/// With a JWKS (`jwks`, `--jwt-jwks-url`) beside them or alone, an RS256 or ES256 token that the configured
/// key of its algorithm does not verify (or that has none) is checked by the JWKS key its `kid` names; the
/// claims are then read by the same rules whichever key verified the token.
public struct JWTAuthorizer: Authorizer {
    public enum Algorithm: String, Sendable, CaseIterable {
        case hs256 = "HS256"
        case rs256 = "RS256"
        case es256 = "ES256"
    }

    public enum KeyError: Error, CustomStringConvertible {
        case notAPublicKey(String)
        case shortSecret

        public var description: String {
            switch self {
            case .notAPublicKey(let file): "\(file): not a PEM RSA or P-256 EC public key"
            case .shortSecret: "the JWT secret must be at least 32 bytes (as long as SHA-256's output)"
            }
        }
    }

    let keys: [Algorithm: JWTKeyCollection]
    /// Keys fetched from a JWKS URL, for RS256 and ES256 tokens with a `kid`.
    public var jwks: JWKSKeySource? = nil
    /// The `aud` and `iss` every token must carry, when configured.
    public var expecting = JWTExpectations()
    public var now: @Sendable () -> Double
    public var name: String { "jwt" }
    public var actions: Set<AuthorizationAction> { [.handshake, .subscribe, .publish] }
    /// A subscription token names a user that must be the session's, set by whichever mode set it.
    public var needsUser: Bool { true }
    public var grantsSessions: Bool { true }

    /// The algorithms this authorizer accepts (one per configured key; RS256 and ES256 with a JWKS).
    public var algorithms: [Algorithm] {
        Algorithm.allCases.filter { keys[$0] != nil || (jwks != nil && $0 != .hs256) }
    }

    /// `hmacSecret` enables HS256; `publicKeyPEM` enables RS256 (an RSA key) or ES256 (a P-256 key).
    public static func make(
        hmacSecret: String?, publicKeyPEM: String?, publicKeyName: String = "public key",
        jwks: JWKSKeySource? = nil, expecting: JWTExpectations = .init(),
        now: @escaping @Sendable () -> Double = AuthorizationPipeline.wallClockSeconds
    ) async throws -> JWTAuthorizer {
        var keys: [Algorithm: JWTKeyCollection] = [:]
        if let hmacSecret {
            // RFC 7518 3.2: an HS256 key is at least as long as the hash; jwt-kit asserts it.
            guard hmacSecret.utf8.count >= 32 else { throw KeyError.shortSecret }
            keys[.hs256] = await JWTKeyCollection().add(hmac: HMACKey(from: hmacSecret), digestAlgorithm: .sha256)
        }
        if let pem = publicKeyPEM {
            if let rsa = try? Insecure.RSA.PublicKey(pem: pem) {
                keys[.rs256] = await JWTKeyCollection().add(rsa: rsa, digestAlgorithm: .sha256)
            } else if let ec = try? ES256PublicKey(pem: pem) {
                keys[.es256] = await JWTKeyCollection().add(ecdsa: ec)
            } else {
                throw KeyError.notAPublicKey(publicKeyName)
            }
        }
        return JWTAuthorizer(keys: keys, jwks: jwks, expecting: expecting, now: now)
    }

    /// Verifies a token's signature with the key of the algorithm its header names (the configured key first,
    /// then the JWKS key its `kid` names); nil when anything is wrong.
    public func verify(_ token: String) async -> JWTClaims? {
        guard let header = try? DefaultJWTParser().parse(Array(token.utf8), as: JWTClaims.self).header,
            let alg = header.alg.flatMap(Algorithm.init(rawValue:))
        else { return nil }
        if let collection = keys[alg], let claims = try? await collection.verify(token, as: JWTClaims.self) {
            return claims
        }
        // A JWKS holds public keys only: an HS256 token never meets it.
        guard let jwks, alg != .hs256 else { return nil }
        return await jwks.verify(token, algorithm: alg, kid: header.kid)
    }

    public func authorize(_ request: AuthorizationRequest, on loop: any EventLoop)
        -> EventLoopFuture<AuthorizationDecision>
    {
        let token = request.message.ext?["token"]
        let channel = request.channel ?? ""
        @Sendable func error(_ refusal: JWTRefusal) -> String {
            let code = request.action == .handshake ? 401 : 403
            return BayeuxError(BayeuxError.Code(code, refusal.rawValue), args: [channel]).description
        }
        let now = self.now()
        let expecting = self.expecting
        switch request.action {
        case .handshake:
            guard let token else { return loop.makeSucceededFuture(.abstain(error(.invalid))) }
            return verified(token, on: loop).map { claims in
                guard let claims else { return .deny(error(.invalid)) }
                switch JWTRules.connection(claims, now: now, expecting: expecting) {
                case .success(let grant): return .allow(user: grant.user, grant: grant)
                case .failure(let refusal): return .deny(error(refusal))
                }
            }
        case .subscribe:
            guard let token else {
                let refusal = JWTRules.subscribe(request.grant, channel: channel, now: now)
                return loop.makeSucceededFuture(
                    refusal.map { $0 == .notGranted ? .abstain(error($0)) : .deny(error($0)) } ?? .allow())
            }
            return verified(token, on: loop).map { claims in
                guard let claims else { return .deny(error(.invalid)) }
                let refusal = JWTRules.subscription(
                    claims, channel: channel, sessionUser: request.user, now: now, expecting: expecting)
                return refusal.map { .deny(error($0)) } ?? .allow()
            }
        case .publish:
            if let token {
                return verified(token, on: loop).map { claims in
                    guard let claims else { return .deny(error(.invalid)) }
                    switch JWTRules.connection(claims, now: now, expecting: expecting) {
                    case .failure(let refusal): return .deny(error(refusal))
                    case .success(let grant):
                        let refusal = JWTRules.publish(grant, channel: channel, now: now)
                        return refusal.map { .deny(error($0)) } ?? .allow()
                    }
                }
            }
            let refusal = JWTRules.publish(request.grant, channel: channel, now: now)
            return loop.makeSucceededFuture(
                refusal.map { $0 == .notGranted ? .abstain(error($0)) : .deny(error($0)) } ?? .allow())
        }
    }

    /// Runs jwt-kit's (async) verification off the event loop and comes back to it.
    private func verified(_ token: JSONValue, on loop: any EventLoop) -> EventLoopFuture<JWTClaims?> {
        guard let text = token.stringValue else { return loop.makeSucceededFuture(nil) }
        return loop.makeFutureWithTask { await self.verify(text) }
    }

    /// A publish's `ext.token` is never delivered to subscribers.
    public func scrub(_ message: inout Message) {
        guard var ext = message.ext, ext["token"] != nil else { return }
        ext["token"] = nil
        message.ext = ext
    }
}
