import JWTKit
import NIOCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The verification keys of one JWKS answer, by algorithm and `kid`.
///
/// Only signing keys pubsub can check are kept: RSA keys for RS256 and P-256 keys for ES256, each with a `kid`,
/// without `use` or with `use: sig`; a key whose `alg` names another algorithm, an `oct` (HMAC) key, an
/// encryption key or a key jwt-kit cannot read is skipped, not fatal (providers publish keys of several kinds).
/// Each key is bound to one algorithm here, when it is read: jwt-kit would otherwise pick the algorithm of a
/// key without `alg` from the first token's header, which a forged token could choose. Private parts a
/// provider might publish by mistake are dropped: these keys only verify.
public struct JWKSKeySet: Sendable {
    /// One collection per algorithm, so that a token is only checked by keys of the algorithm its header names.
    let collections: [JWTAuthorizer.Algorithm: JWTKeyCollection]
    /// The kids held, by algorithm; a kid not here is unknown (jwt-kit would fall back to a default key).
    public let kids: [JWTAuthorizer.Algorithm: Set<String>]

    public var count: Int { kids.values.reduce(0) { $0 + $1.count } }
    public var isEmpty: Bool { count == 0 }

    /// The keys of a JWKS document; throws `JWKSFailure` (`unreadable`: not a JWKS; `noKeys`: no usable key).
    public static func parse(_ body: ByteBuffer) async throws(JWKSFailure) -> JWKSKeySet {
        let document: Document
        do {
            document = try JSONDecoder().decode(Document.self, from: Data(body.readableBytesView))
        } catch {
            throw JWKSFailure(.unreadable, "not a JWKS: \(error)")
        }
        var collections: [JWTAuthorizer.Algorithm: JWTKeyCollection] = [:]
        var kids: [JWTAuthorizer.Algorithm: Set<String>] = [:]
        for entry in document.keys {
            guard var jwk = entry.jwk, let kid = jwk.keyIdentifier?.string, !kid.isEmpty,
                entry.use == nil || entry.use == "sig", let algorithm = Self.algorithm(of: jwk)
            else { continue }
            jwk.algorithm = algorithm == .rs256 ? .rs256 : .es256
            jwk.privateExponent = nil
            jwk.prime1 = nil
            jwk.prime2 = nil
            let collection = collections[algorithm] ?? JWTKeyCollection()
            // A key jwt-kit cannot build (a bad modulus, a point off the curve) is skipped like any unusable key.
            guard (try? await collection.add(jwk: jwk)) != nil else { continue }
            collections[algorithm] = collection
            kids[algorithm, default: []].insert(kid)
        }
        let set = JWKSKeySet(collections: collections, kids: kids)
        guard !set.isEmpty else {
            throw JWKSFailure(.noKeys, "no RS256 or ES256 signing key with a kid among \(document.keys.count) key(s)")
        }
        return set
    }

    /// The algorithm a key verifies: its `alg`, which must be one pubsub accepts, or else what its type implies.
    static func algorithm(of jwk: JWK) -> JWTAuthorizer.Algorithm? {
        switch jwk.keyType {
        case .rsa where jwk.algorithm == nil || jwk.algorithm == .rs256: .rs256
        case .ecdsa where (jwk.algorithm == nil || jwk.algorithm == .es256) && jwk.curve?.rawValue == "P-256": .es256
        default: nil
        }
    }

    /// Whether a token with this algorithm and kid meets a key here.
    public func has(_ algorithm: JWTAuthorizer.Algorithm, kid: String) -> Bool {
        kids[algorithm]?.contains(kid) ?? false
    }

    /// Verifies the signature with the key of that algorithm and kid; nil when the kid is not held or anything
    /// is wrong with the token.
    func verify(_ token: String, algorithm: JWTAuthorizer.Algorithm, kid: String) async -> JWTClaims? {
        guard has(algorithm, kid: kid), let collection = collections[algorithm] else { return nil }
        return try? await collection.verify(token, as: JWTClaims.self)
    }

    /// `{"keys": [...]}`, each key read on its own: one that is not a JWK jwt-kit knows is nil, not an error.
    struct Document: Decodable {
        var keys: [Entry]
    }

    struct Entry: Decodable {
        var jwk: JWK?
        var use: String?

        enum CodingKeys: String, CodingKey { case use }

        init(from decoder: any Decoder) throws {
            jwk = try? JWK(from: decoder)
            use = try? decoder.container(keyedBy: CodingKeys.self).decodeIfPresent(String.self, forKey: .use)
        }
    }
}

/// Why a JWKS fetch did not give keys: the `reason` of `pubsub_jwks_refresh_failures_total`.
public struct JWKSFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable, CaseIterable {
        /// Connection refused, DNS, TLS: no answer.
        case unreachable
        /// No whole answer within the timeout.
        case timeout
        /// An answer other than 200.
        case status
        /// A body over the size bound.
        case tooLarge = "too_large"
        /// Not JSON, or not `{"keys": [...]}`.
        case unreadable
        /// A JWKS without one key pubsub can use.
        case noKeys = "no_keys"
    }

    public var code: Code
    public var detail: String

    public init(_ code: Code, _ detail: String) {
        self.code = code
        self.detail = detail
    }

    public var description: String { "\(code.rawValue): \(detail)" }
}
