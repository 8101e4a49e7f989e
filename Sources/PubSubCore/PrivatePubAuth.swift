import Bayeux
import Crypto

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// PrivatePub's subscription signatures and publish token, byte-compatible with the `private_pub` gem:
/// `signature = hex(SHA-1(secret + channel + timestamp))`, timestamp in milliseconds. Stricter than the gem
/// where that breaks nobody: comparisons take constant time, timestamps too far in the future are refused,
/// and a subscribe or publish without `ext` gets an error reply instead of a hang.
public struct PrivatePubAuth: BayeuxExtension {
    public static let incorrectSignature = "Incorrect signature."
    public static let expiredSignature = "Signature has expired."
    public static let futureSignature = "Signature timestamp is in the future."
    public static let incorrectToken = "Incorrect token."

    public var secret: String
    /// Seconds a signature stays valid; nil means forever, as in PrivatePub.
    public var signatureExpiration: Double?
    /// How far in the future (seconds) a timestamp may be, for clock skew between the app and the broker.
    public var maxClockSkew: Double
    /// Wall-clock milliseconds since the epoch.
    public var now: @Sendable () -> Int64
    /// Which subscription signatures are accepted: PrivatePub's SHA-1, HMAC-SHA256, or either.
    public var signatures: SignatureScheme
    /// With HMAC signatures: refuse a signature that is not bound to the subscriber's clientId.
    public var requireClientBinding: Bool
    /// Channel patterns anyone may subscribe to without a signature (publishing still needs the token).
    public var publicChannels: [String]

    public init(
        secret: String,
        signatureExpiration: Double? = nil,
        maxClockSkew: Double = 300,
        signatures: SignatureScheme = .privatePub,
        requireClientBinding: Bool = false,
        publicChannels: [String] = [],
        now: @escaping @Sendable () -> Int64 = PrivatePubAuth.wallClockMilliseconds
    ) {
        self.secret = secret
        self.signatureExpiration = signatureExpiration
        self.maxClockSkew = maxClockSkew
        self.signatures = signatures
        self.requireClientBinding = requireClientBinding
        self.publicChannels = publicChannels
        self.now = now
    }

    @Sendable public static func wallClockMilliseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }

    /// `hex(SHA-1(secret + channel + timestamp))`, as PrivatePub's `subscription` helper computes it.
    public static func signature(secret: String, channel: String, timestamp: String) -> String {
        let digest = Insecure.SHA1.hash(data: Array((secret + channel + timestamp).utf8))
        return digest.map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }

    public func incoming(_ message: inout Message, context: RequestContext) -> Bool {
        guard let channel = message.channel else { return true }
        if channel == Channel.subscribe {
            if let error = checkSubscription(message) { message.error = error }
        } else if !Channel.isMeta(channel) {
            guard var ext = message.ext, let token = ext["private_pub_token"]?.stringValue,
                constantTimeEqual(token, secret)
            else {
                message.error = Self.incorrectToken
                return true
            }
            ext["private_pub_token"] = .null
            message.ext = ext
        }
        return true
    }

    func checkSubscription(_ message: Message) -> String? {
        if isPublicSubscription(message) { return nil }
        switch signatures {
        case .privatePub: return checkPrivatePubSignature(message)
        case .hmac: return checkHMACSignature(message)
        case .both:
            return message.ext?["signature"] != nil
                ? checkHMACSignature(message) : checkPrivatePubSignature(message)
        }
    }

    func checkPrivatePubSignature(_ message: Message) -> String? {
        guard
            let signed = SignedSubscription(
                message, signature: "private_pub_signature", timestamp: "private_pub_timestamp")
        else { return Self.incorrectSignature }
        let expected = Self.signature(secret: secret, channel: signed.channel, timestamp: signed.timestampText)
        guard constantTimeEqual(signed.signature, expected) else { return Self.incorrectSignature }
        return checkTimestamp(signed.timestamp)
    }

    /// What a signed `/meta/subscribe` carries, whichever scheme signed it: the signature, the subscription
    /// (a channel, or an array of exactly one), and the timestamp as sent (a number or a numeric string).
    struct SignedSubscription {
        var signature: String
        var channel: String
        var timestamp: JSONValue
        var timestampText: String

        init?(_ message: Message, signature signatureKey: String, timestamp timestampKey: String) {
            guard let ext = message.ext, let signature = ext[signatureKey]?.stringValue,
                let timestamp = ext[timestampKey]
            else { return nil }
            switch message["subscription"] {
            case .string(let s)?: channel = s
            case .array(let a)? where a.count == 1 && a[0].stringValue != nil: channel = a[0].stringValue!
            default: return nil
            }
            switch timestamp {
            case .number(let text), .string(let text): timestampText = text
            default: return nil
            }
            self.signature = signature
            self.timestamp = timestamp
        }
    }

    /// The expiry and clock-skew checks shared by both signature schemes, after the signature matched.
    func checkTimestamp(_ timestampValue: JSONValue) -> String? {
        guard let timestamp = timestampValue.integerValue else { return Self.incorrectSignature }
        let nowMs = now()
        if let expiration = signatureExpiration,
            Double(timestamp) < (Double(nowMs) - expiration * 1000).rounded()
        {
            return Self.expiredSignature
        }
        if Double(timestamp) > Double(nowMs) + maxClockSkew * 1000 { return Self.futureSignature }
        return nil
    }
}

/// Compares two strings in time that depends only on their lengths.
public func constantTimeEqual(_ a: String, _ b: String) -> Bool {
    let x = Array(a.utf8)
    let y = Array(b.utf8)
    var difference = UInt8(x.count == y.count ? 0 : 1)
    let n = max(x.count, y.count)
    for i in 0..<n {
        let p = i < x.count ? x[i] : 0
        let q = i < y.count ? y[i] : 0
        difference |= p ^ q
    }
    return difference == 0
}
