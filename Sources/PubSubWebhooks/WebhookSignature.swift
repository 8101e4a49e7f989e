import Crypto

/// `X-Pubsub-Signature: sha256=<hex>`: the HMAC-SHA256 of the exact body bytes, keyed with the webhook secret.
public enum WebhookSignature {
    public static let header = "X-Pubsub-Signature"

    public static func sign<Body: Sequence>(_ body: Body, secret: String) -> String where Body.Element == UInt8 {
        let code = HMAC<SHA256>.authenticationCode(for: Array(body), using: SymmetricKey(data: Array(secret.utf8)))
        return "sha256=" + hex(code)
    }

    /// Whether `signature` is the signature of `body`, compared in constant time (for receivers written in Swift).
    public static func verify<Body: Sequence>(_ signature: String, body: Body, secret: String) -> Bool
    where Body.Element == UInt8 {
        guard signature.hasPrefix("sha256="), let mac = bytes(hex: signature.dropFirst(7)) else { return false }
        return HMAC<SHA256>.isValidAuthenticationCode(
            mac, authenticating: Array(body), using: SymmetricKey(data: Array(secret.utf8)))
    }

    static func hex<Bytes: Sequence>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func bytes(hex: Substring) -> [UInt8]? {
        let utf8 = Array(hex.utf8)
        guard utf8.count % 2 == 0 else { return nil }
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(utf8.count / 2)
        var i = 0
        while i < utf8.count {
            guard let high = value(utf8[i]), let low = value(utf8[i + 1]) else { return nil }
            out.append(high << 4 | low)
            i += 2
        }
        return out
    }
}
