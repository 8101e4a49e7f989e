/// The frame type in the low three bits of a BLIP frame's flags.
public enum BLIPFrameType: UInt8, Sendable {
    case request = 0  // MSG
    case response = 1  // RPY
    case error = 2  // ERR
    case ackRequest = 4  // ACKMSG
    case ackResponse = 5  // ACKRPY

    /// Whether frames of this type carry a message (and a checksum), as opposed to an ACK.
    public var isMessage: Bool { rawValue <= 2 }
}

/// BLIP frame flags (`BLIP Protocol.md` §3.5); bits not listed are ignored.
public struct BLIPFlags: OptionSet, Sendable, Hashable {
    public var rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let typeMask: UInt8 = 0x07
    public static let compressed = BLIPFlags(rawValue: 0x08)
    public static let urgent = BLIPFlags(rawValue: 0x10)
    public static let noReply = BLIPFlags(rawValue: 0x20)
    public static let moreComing = BLIPFlags(rawValue: 0x40)
}

/// A whole BLIP message: request, response or error, with its properties and body.
public struct BLIPMessage: Sendable, Equatable {
    public var type: BLIPFrameType
    /// The request number; a reply carries the number of the request it answers.
    public var number: UInt64
    /// Only `urgent`, `noReply` and `compressed` are meaningful here; framing sets the rest.
    public var flags: BLIPFlags
    /// In order; keys and values contain no NUL.
    public var properties: [(String, String)]
    public var body: [UInt8]

    public init(
        type: BLIPFrameType, number: UInt64, flags: BLIPFlags = [], properties: [(String, String)] = [],
        body: [UInt8] = []
    ) {
        self.type = type
        self.number = number
        self.flags = flags
        self.properties = properties
        self.body = body
    }

    public subscript(property: String) -> String? {
        properties.first { $0.0 == property }?.1
    }

    public var profile: String? { self["Profile"] }

    /// `Error-Domain` and `Error-Code` of an ERR message, with its body as text.
    public var errorDescription: String {
        let domain = self["Error-Domain"] ?? "BLIP"
        let code = self["Error-Code"] ?? "?"
        return "\(domain) \(code) \(String(decoding: body, as: UTF8.self))"
    }

    /// The payload before framing: `varint propsLength`, NUL-terminated keys and values, body.
    public var encodedPayload: [UInt8] {
        var properties: [UInt8] = []
        for (key, value) in self.properties {
            properties += Array(key.utf8) + [0] + Array(value.utf8) + [0]
        }
        var payload = BLIPVarint.encode(UInt64(properties.count))
        payload += properties
        payload += body
        return payload
    }

    /// Splits a reassembled payload into properties and body.
    public static func decodePayload(_ payload: [UInt8]) throws -> (properties: [(String, String)], body: [UInt8]) {
        var offset = 0
        guard let length = BLIPVarint.read(payload, at: &offset) else {
            throw RelayError(.blipProtocol, "bad properties length")
        }
        guard length <= UInt64(payload.count - offset) else {
            throw RelayError(
                .blipProtocol, "properties length \(length) exceeds the message (\(payload.count - offset) bytes)")
        }
        let end = offset + Int(length)
        let propertyBytes = payload[offset..<end]
        var strings = propertyBytes.split(separator: 0, omittingEmptySubsequences: false).map {
            String(decoding: $0, as: UTF8.self)
        }
        if !propertyBytes.isEmpty {
            guard propertyBytes.last == 0 else { throw RelayError(.blipProtocol, "properties do not end with NUL") }
            strings.removeLast()
        } else {
            strings = []
        }
        guard strings.count % 2 == 0 else { throw RelayError(.blipProtocol, "a property has no value") }
        var properties: [(String, String)] = []
        for index in stride(from: 0, to: strings.count, by: 2) {
            properties.append((strings[index], strings[index + 1]))
        }
        return (properties, Array(payload[end...]))
    }

    public static func == (lhs: BLIPMessage, rhs: BLIPMessage) -> Bool {
        lhs.type == rhs.type && lhs.number == rhs.number && lhs.flags == rhs.flags && lhs.body == rhs.body
            && lhs.properties.elementsEqual(rhs.properties) { $0.0 == $1.0 && $0.1 == $1.1 }
    }
}
