import Bayeux
import Crypto

/// Which subscription signatures the broker accepts.
public enum SignatureScheme: String, Sendable, CaseIterable {
    /// PrivatePub's `hex(SHA-1(secret + channel + timestamp))` in `ext.private_pub_signature`.
    case privatePub = "privatepub"
    /// `hex(HMAC-SHA256(secret, signing string))` in `ext.signature`, optionally bound to the clientId.
    case hmac
    /// Either: a subscribe carrying `ext.signature` is checked as HMAC, any other as PrivatePub.
    case both
}

/// The strong mode: HMAC-SHA256 subscription signatures.
///
/// A subscribe carries `ext.signature` (64 lowercase hex digits) and `ext.timestamp` (milliseconds since the
/// epoch, a number or a numeric string). The signed text is four lines joined by `\n` (no trailing newline):
///
///     subscribe
///     <subscription channel or pattern>
///     <timestamp, exactly as sent>
///     <clientId, or empty when the signature is not bound to a client>
///
/// Channel names cannot contain a newline and timestamps are digits, so the fields cannot run into each other.
/// A bound signature is only good for the client whose id it names; an unbound one works for any client
/// unless the broker requires binding. Expiry and the clock-skew bound are the same as for PrivatePub.
extension PrivatePubAuth {
    public static func hmacSigningString(channel: String, timestamp: String, clientId: String?) -> String {
        "subscribe\n\(channel)\n\(timestamp)\n\(clientId ?? "")"
    }

    public static func hmacSignature(secret: String, channel: String, timestamp: String, clientId: String? = nil)
        -> String
    {
        let key = SymmetricKey(data: Array(secret.utf8))
        let text = hmacSigningString(channel: channel, timestamp: timestamp, clientId: clientId)
        let code = HMAC<SHA256>.authenticationCode(for: Array(text.utf8), using: key)
        return hex(Array(code))
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    func checkHMACSignature(_ message: Message) -> String? {
        guard let signed = SignedSubscription(message, signature: "signature", timestamp: "timestamp") else {
            return Self.incorrectSignature
        }
        let (signature, subscription, timestampText) = (signed.signature, signed.channel, signed.timestampText)
        // Both candidates are always computed and compared, so timing does not tell which one matched.
        let bound = message.clientId.map {
            Self.hmacSignature(secret: secret, channel: subscription, timestamp: timestampText, clientId: $0)
        }
        let unbound = Self.hmacSignature(secret: secret, channel: subscription, timestamp: timestampText)
        let matchesBound = bound.map { constantTimeEqual(signature, $0) } ?? false
        let matchesUnbound = constantTimeEqual(signature, unbound)
        guard matchesBound || (matchesUnbound && !requireClientBinding) else { return Self.incorrectSignature }
        return checkTimestamp(signed.timestamp)
    }
}
