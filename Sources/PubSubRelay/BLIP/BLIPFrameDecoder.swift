/// Decodes the frames one side receives (one WebSocket binary message each), checks the running checksum, inflates
/// compressed frames and reassembles multi-frame messages. A plain state machine: frames in, events out; any
/// thrown `RelayError` is fatal for the connection.
public struct BLIPFrameDecoder {
    public enum Event: Equatable, Sendable {
        /// A complete message.
        case message(BLIPMessage)
        /// The peer acknowledged `received` bytes of one of our messages.
        case ack(BLIPFrameType, number: UInt64, received: UInt64)
        /// Flow control: the peer wants this ACK sent for a long message being received.
        case sendAck(BLIPFrameType, number: UInt64, received: UInt64)
    }

    struct Key: Hashable {
        var isReply: Bool
        var number: UInt64
    }

    struct Partial {
        var type: BLIPFrameType
        var flags: BLIPFlags
        var payload: [UInt8]
        var received: UInt64
        var acknowledged: UInt64
    }

    /// Bytes of one message after which an ACK is due.
    public static let ackInterval: UInt64 = 50_000

    public private(set) var checksum = BLIPCRC32()
    public let maxMessageSize: Int
    var partials: [Key: Partial] = [:]
    var inflater: BLIPInflater?

    public init(maxMessageSize: Int = 16 << 20) {
        self.maxMessageSize = maxMessageSize
    }

    public mutating func receive(_ frame: some Collection<UInt8>) throws -> [Event] {
        let bytes = Array(frame)
        var offset = 0
        guard let number = BLIPVarint.read(bytes, at: &offset) else {
            throw RelayError(.blipProtocol, bytes.isEmpty ? "empty frame" : "bad varint in the frame's message number")
        }
        guard let rawFlags = BLIPVarint.read(bytes, at: &offset) else {
            throw RelayError(.blipProtocol, "frame without flags")
        }
        let flags = BLIPFlags(rawValue: UInt8(truncatingIfNeeded: rawFlags))
        let typeBits = UInt8(truncatingIfNeeded: rawFlags) & BLIPFlags.typeMask
        let type = BLIPFrameType(rawValue: typeBits)

        if type == .ackRequest || type == .ackResponse {
            guard let received = BLIPVarint.read(bytes, at: &offset) else {
                throw RelayError(.blipProtocol, "bad varint in an ACK")
            }
            // An ACKMSG acknowledges one of our requests, an ACKRPY one of our replies.
            return [.ack(type == .ackRequest ? .request : .response, number: number, received: received)]
        }

        guard bytes.count - offset >= 4 else { throw RelayError(.blipProtocol, "frame too short for its checksum") }
        let data = bytes[offset..<(bytes.count - 4)]
        let expected = bytes.suffix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        let payload: [UInt8]
        if flags.contains(.compressed) {
            if inflater == nil {
                do { inflater = try BLIPInflater(maxOutput: maxMessageSize) } catch {
                    throw RelayError(.blipProtocol, "cannot start an inflater: \(error)")
                }
            }
            payload = try inflater!.inflate(data)
        } else {
            payload = Array(data)
        }
        checksum.update(payload)
        guard checksum.value == expected else {
            throw RelayError(
                .blipProtocol,
                "checksum mismatch on frame \(number) (expected \(hex(expected)), computed \(hex(checksum.value)))")
        }
        guard let type else { return [] }  // unknown frame type: ignored

        let key = Key(isReply: type != .request, number: number)
        var partial =
            partials.removeValue(forKey: key)
            ?? Partial(type: type, flags: flags, payload: [], received: 0, acknowledged: 0)
        partial.payload += payload
        partial.received += UInt64(data.count)
        guard partial.payload.count <= maxMessageSize else {
            throw RelayError(.blipProtocol, "message \(number) is larger than \(maxMessageSize) bytes")
        }
        if flags.contains(.moreComing) {
            var events: [Event] = []
            if partial.received - partial.acknowledged >= Self.ackInterval {
                partial.acknowledged = partial.received
                events.append(
                    .sendAck(
                        type == .request ? .ackRequest : .ackResponse, number: number,
                        received: partial.received))
            }
            partials[key] = partial
            return events
        }
        let (properties, body) = try BLIPMessage.decodePayload(partial.payload)
        let messageFlags = partial.flags.intersection([.urgent, .noReply, .compressed])
        return [
            .message(
                BLIPMessage(
                    type: partial.type, number: number, flags: messageFlags,
                    properties: properties, body: body))
        ]
    }

    private func hex(_ value: UInt32) -> String {
        let digits = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: 8 - digits.count) + digits
    }
}
