import Crypto
import ExtrasBase64

/// The client side of SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL speaks it: no channel binding (`n,,`), an
/// empty user name in the messages (the server takes the startup's), the password SASLprep'd as PostgreSQL
/// prepares it (`SASLprep`).
struct SCRAMSHA256Client: Sendable {
    enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        case malformedServerMessage(String)
        case nonceMismatch
        case tooFewIterations(Int)
        case serverSignatureMismatch
        case serverError(String)

        var description: String {
            switch self {
            case .malformedServerMessage(let what): "PostgreSQL sent a malformed SCRAM message (\(what))"
            case .nonceMismatch: "PostgreSQL's SCRAM nonce does not extend ours"
            case .tooFewIterations(let count): "PostgreSQL asked for \(count) SCRAM iterations (at least 4096 expected)"
            case .serverSignatureMismatch:
                "PostgreSQL's SCRAM signature is wrong: the server does not know the password"
            case .serverError(let text): "PostgreSQL refused the SCRAM proof: \(text)"
            }
        }
    }

    static let mechanism = "SCRAM-SHA-256"

    private let password: [UInt8]
    private let clientNonce: String
    /// Empty for PostgreSQL, which takes the startup message's user; RFC 7677's example names one.
    private let user: String
    private var authMessage: [UInt8] = []
    private var saltedPassword: [UInt8] = []

    init(password: String, nonce: String, user: String = "") {
        self.password = Array(SASLprep.prepare(password).utf8)
        self.clientNonce = nonce
        self.user = user
    }

    /// A nonce of 18 random bytes, in base64 (printable, no comma).
    static func randomNonce() -> String {
        var generator = SystemRandomNumberGenerator()
        return Base64.encodeToString(bytes: (0..<18).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    private var clientFirstBare: String { "n=" + user + ",r=" + clientNonce }

    /// The client-first-message.
    var firstMessage: [UInt8] { Array(("n,," + clientFirstBare).utf8) }

    /// Takes the server-first-message; returns the client-final-message, with the proof.
    mutating func finalMessage(after serverFirst: [UInt8]) throws(Failure) -> [UInt8] {
        let text = String(decoding: serverFirst, as: UTF8.self)
        let attributes = Self.attributes(text)
        guard let nonce = attributes["r"], let saltText = attributes["s"], let iterationText = attributes["i"] else {
            throw .malformedServerMessage("no r, s or i")
        }
        guard nonce.hasPrefix(clientNonce), nonce.count > clientNonce.count else { throw .nonceMismatch }
        guard let salt = try? saltText.base64decoded() else { throw .malformedServerMessage("salt is not base64") }
        guard let iterations = Int(iterationText), iterations > 0 else {
            throw .malformedServerMessage("bad iteration count")
        }
        guard iterations >= 4096 else { throw .tooFewIterations(iterations) }
        saltedPassword = Self.hi(password: password, salt: salt, iterations: iterations)
        let withoutProof = "c=biws,r=" + nonce
        authMessage = Array((clientFirstBare + "," + text + "," + withoutProof).utf8)
        let clientKey = Self.hmac(saltedPassword, Array("Client Key".utf8))
        let storedKey = Array(SHA256.hash(data: clientKey))
        let signature = Self.hmac(storedKey, authMessage)
        let proof = zip(clientKey, signature).map { $0 ^ $1 }
        return Array((withoutProof + ",p=" + Base64.encodeToString(bytes: proof)).utf8)
    }

    /// Checks the server-final-message: the server proves that it knows the password too.
    func verify(serverFinal: [UInt8]) throws(Failure) {
        let attributes = Self.attributes(String(decoding: serverFinal, as: UTF8.self))
        if let error = attributes["e"] { throw .serverError(error) }
        guard let text = attributes["v"], let signature = try? text.base64decoded() else {
            throw .malformedServerMessage("no verifier")
        }
        let serverKey = Self.hmac(saltedPassword, Array("Server Key".utf8))
        let expected = Self.hmac(serverKey, authMessage)
        guard signature.count == expected.count, zip(signature, expected).reduce(0, { $0 | ($1.0 ^ $1.1) }) == 0
        else { throw .serverSignatureMismatch }
    }

    private static func attributes(_ text: String) -> [String: String] {
        var result: [String: String] = [:]
        for part in text.split(separator: ",") {
            guard let equals = part.firstIndex(of: "="), part.distance(from: part.startIndex, to: equals) == 1 else {
                continue
            }
            result[String(part[..<equals])] = String(part[part.index(after: equals)...])
        }
        return result
    }

    static func hmac(_ key: [UInt8], _ message: [UInt8]) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: message, using: SymmetricKey(data: key)))
    }

    /// Hi(): PBKDF2 with HMAC-SHA-256, one block.
    static func hi(password: [UInt8], salt: [UInt8], iterations: Int) -> [UInt8] {
        let key = SymmetricKey(data: password)
        var block = Array(HMAC<SHA256>.authenticationCode(for: salt + [0, 0, 0, 1], using: key))
        var result = block
        for _ in 1..<iterations {
            block = Array(HMAC<SHA256>.authenticationCode(for: block, using: key))
            for index in result.indices { result[index] ^= block[index] }
        }
        return result
    }
}

/// PostgreSQL's MD5 password answer: `md5` + md5hex(md5hex(password + user) + salt).
enum PostgresMD5Password {
    static func answer(user: String, password: String, salt: [UInt8]) -> String {
        let inner = hex(Insecure.MD5.hash(data: Array((password + user).utf8)))
        return "md5" + hex(Insecure.MD5.hash(data: Array(inner.utf8) + salt))
    }

    private static func hex(_ digest: Insecure.MD5.Digest) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for byte in digest {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}
