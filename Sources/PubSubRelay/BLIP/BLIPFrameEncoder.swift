/// Encodes the messages one side sends into frames (one WebSocket binary message each), keeping that direction's
/// running checksum and deflate stream. Frames must be sent in the order they were made.
public struct BLIPFrameEncoder {
    public private(set) var checksum = BLIPCRC32()
    /// Largest payload per frame before compression; longer messages are split (MoreComing).
    public var maxFramePayload: Int
    public private(set) var lastRequestNumber: UInt64 = 0
    var deflater: BLIPDeflater?

    public init(maxFramePayload: Int = 16384) {
        self.maxFramePayload = max(1, maxFramePayload)
    }

    /// The number for our next request (MSG), counting from 1.
    public mutating func nextRequestNumber() -> UInt64 {
        lastRequestNumber += 1
        return lastRequestNumber
    }

    /// The frames of `message`, deflated when `compress` is set.
    public mutating func frames(for message: BLIPMessage, compress: Bool = false) throws -> [[UInt8]] {
        let payload = message.encodedPayload
        var frames: [[UInt8]] = []
        var start = 0
        repeat {
            let end = min(payload.count, start + maxFramePayload)
            let chunk = Array(payload[start..<end])
            var flags = message.flags.intersection([.urgent, .noReply])
            flags.rawValue |= message.type.rawValue
            if end < payload.count { flags.insert(.moreComing) }
            if compress { flags.insert(.compressed) }
            var frame = BLIPVarint.encode(message.number)
            BLIPVarint.write(UInt64(flags.rawValue), to: &frame)
            checksum.update(chunk)
            if compress {
                if deflater == nil {
                    do {
                        deflater = try BLIPDeflater()
                    } catch {
                        throw RelayError(.blipProtocol, "cannot start a deflater: \(error)")
                    }
                }
                frame += try deflater!.deflate(chunk)
            } else {
                frame += chunk
            }
            let crc = checksum.value
            frame += [
                UInt8(crc >> 24), UInt8(truncatingIfNeeded: crc >> 16), UInt8(truncatingIfNeeded: crc >> 8),
                UInt8(truncatingIfNeeded: crc),
            ]
            frames.append(frame)
            start = end
        } while start < payload.count
        return frames
    }

    /// An ACKMSG/ACKRPY frame (urgent, no reply, no checksum) telling the peer how much of a message arrived.
    public static func ack(_ type: BLIPFrameType, number: UInt64, received: UInt64) -> [UInt8] {
        var frame = BLIPVarint.encode(number)
        BLIPVarint.write(UInt64(type.rawValue | BLIPFlags.urgent.rawValue | BLIPFlags.noReply.rawValue), to: &frame)
        BLIPVarint.write(received, to: &frame)
        return frame
    }
}
