import CompressNIO
import NIOCore

/// The fake Sync Gateway's own BLIP v3 framing, written from the protocol description and independent of the
/// relay's codec (the golden frames in the tests pin both): frame = varint number, varint flags, payload,
/// big-endian running CRC-32 of the uncompressed payloads (not on ACKs).
enum FakeBLIP {
    static let msg: UInt8 = 0, rpy: UInt8 = 1, err: UInt8 = 2, ackMsg: UInt8 = 4, ackRpy: UInt8 = 5
    static let compressed: UInt8 = 0x08, urgent: UInt8 = 0x10, noReply: UInt8 = 0x20, moreComing: UInt8 = 0x40

    struct WireError: Error, CustomStringConvertible {
        var description: String
    }

    struct Message {
        var type: UInt8
        var number: UInt64
        var flags: UInt8 = 0
        var properties: [String: String] = [:]
        var propertyOrder: [String] = []
        var body: [UInt8] = []

        init(
            type: UInt8, number: UInt64, flags: UInt8 = 0, properties: KeyValuePairs<String, String> = [:],
            body: [UInt8] = []
        ) {
            self.type = type
            self.number = number
            self.flags = flags
            for (key, value) in properties {
                self.properties[key] = value
                propertyOrder.append(key)
            }
            self.body = body
        }
    }

    /// Bit-by-bit CRC-32 (reflected polynomial 0xEDB88320), continued from `crc`.
    static func crc32(_ bytes: some Sequence<UInt8>, continuing crc: UInt32) -> UInt32 {
        var register = crc ^ 0xFFFF_FFFF
        for byte in bytes {
            register ^= UInt32(byte)
            for _ in 0..<8 { register = (register >> 1) ^ (0xEDB8_8320 & (0 &- (register & 1))) }
        }
        return register ^ 0xFFFF_FFFF
    }

    static func putVarint(_ value: UInt64, _ out: inout [UInt8]) {
        var rest = value
        repeat {
            let low = UInt8(rest & 0x7F)
            rest >>= 7
            out.append(rest == 0 ? low : low | 0x80)
        } while rest != 0
    }

    static func getVarint(_ bytes: [UInt8], _ position: inout Int) throws -> UInt64 {
        var result: UInt64 = 0
        for shift in stride(from: 0, through: 63, by: 7) {
            guard position < bytes.count else { throw WireError(description: "truncated varint") }
            let byte = bytes[position]
            position += 1
            result |= UInt64(byte & 0x7F) << UInt64(shift)
            if byte < 0x80 { return result }
        }
        throw WireError(description: "varint longer than 64 bits")
    }
}

/// One direction's sending state of the fake: running CRC, deflate stream, frame size.
final class FakeBLIPWriter {
    private var crc: UInt32 = 0
    private var deflater: ZlibCompressor?
    let frameSize: Int

    init(frameSize: Int) { self.frameSize = frameSize }

    func frames(_ message: FakeBLIP.Message, compress: Bool) throws -> [[UInt8]] {
        var properties: [UInt8] = []
        for key in message.propertyOrder {
            properties += Array(key.utf8) + [0] + Array(message.properties[key]!.utf8) + [0]
        }
        var payload: [UInt8] = []
        FakeBLIP.putVarint(UInt64(properties.count), &payload)
        payload += properties + message.body
        var frames: [[UInt8]] = []
        var offset = 0
        while true {
            let chunk = Array(payload[offset..<min(payload.count, offset + frameSize)])
            offset += chunk.count
            let last = offset >= payload.count
            var flags = message.type | (message.flags & (FakeBLIP.urgent | FakeBLIP.noReply))
            if !last { flags |= FakeBLIP.moreComing }
            if compress { flags |= FakeBLIP.compressed }
            var frame: [UInt8] = []
            FakeBLIP.putVarint(message.number, &frame)
            FakeBLIP.putVarint(UInt64(flags), &frame)
            crc = FakeBLIP.crc32(chunk, continuing: crc)
            frame += compress ? try deflate(chunk) : chunk
            withUnsafeBytes(of: crc.bigEndian) { frame += $0 }
            frames.append(frame)
            if last { return frames }
        }
    }

    private func deflate(_ chunk: [UInt8]) throws -> [UInt8] {
        if deflater == nil { deflater = try ZlibCompressor(algorithm: .deflate) }
        var input = ByteBuffer(bytes: chunk)
        var output = ByteBufferAllocator().buffer(capacity: chunk.count * 2 + 64)
        try deflater!.deflate(from: &input, to: &output, flush: .sync)
        var bytes = Array(output.readableBytesView)
        guard input.readableBytes == 0, bytes.suffix(4) == [0, 0, 0xFF, 0xFF] else {
            throw FakeBLIP.WireError(description: "deflate did not complete")
        }
        bytes.removeLast(4)
        return bytes
    }
}

/// One direction's receiving state of the fake: checks the running CRC, inflates, reassembles.
final class FakeBLIPReader {
    enum Received {
        case message(FakeBLIP.Message)
        case ack(type: UInt8, number: UInt64, bytes: UInt64)
        case partial(type: UInt8, number: UInt64, bytes: Int)
    }

    private var crc: UInt32 = 0
    private var inflater: ZlibDecompressor?
    private var pending: [String: (flags: UInt8, payload: [UInt8], bytes: Int)] = [:]

    func read(_ frame: [UInt8]) throws -> Received? {
        var position = 0
        let number = try FakeBLIP.getVarint(frame, &position)
        let flags = UInt8(truncatingIfNeeded: try FakeBLIP.getVarint(frame, &position))
        let type = flags & 0x07
        if type == FakeBLIP.ackMsg || type == FakeBLIP.ackRpy {
            return .ack(type: type, number: number, bytes: try FakeBLIP.getVarint(frame, &position))
        }
        guard frame.count - position >= 4 else { throw FakeBLIP.WireError(description: "frame without checksum") }
        let wire = Array(frame[position..<(frame.count - 4)])
        let sent = frame.suffix(4).reduce(UInt32(0)) { ($0 << 8) + UInt32($1) }
        let payload = flags & FakeBLIP.compressed != 0 ? try inflate(wire) : wire
        crc = FakeBLIP.crc32(payload, continuing: crc)
        guard crc == sent else {
            throw FakeBLIP.WireError(description: "checksum mismatch: frame says \(sent), computed \(crc)")
        }
        guard type <= FakeBLIP.err else { return nil }
        let key = "\(type == FakeBLIP.msg ? "in" : "out")#\(number)"
        var entry = pending.removeValue(forKey: key) ?? (flags, [], 0)
        entry.payload += payload
        entry.bytes += wire.count
        if flags & FakeBLIP.moreComing != 0 {
            pending[key] = entry
            return .partial(type: type, number: number, bytes: entry.bytes)
        }
        var offset = 0
        let length = Int(try FakeBLIP.getVarint(entry.payload, &offset))
        guard offset + length <= entry.payload.count else {
            throw FakeBLIP.WireError(description: "properties longer than the message")
        }
        let strings = entry.payload[offset..<(offset + length)].split(separator: 0, omittingEmptySubsequences: false)
            .dropLast().map { String(decoding: $0, as: UTF8.self) }
        var message = FakeBLIP.Message(
            type: type, number: number, flags: entry.flags,
            body: Array(entry.payload[(offset + length)...]))
        var index = 0
        while index + 1 < strings.count {
            message.properties[strings[index]] = strings[index + 1]
            message.propertyOrder.append(strings[index])
            index += 2
        }
        return .message(message)
    }

    private func inflate(_ wire: [UInt8]) throws -> [UInt8] {
        if inflater == nil { inflater = try ZlibDecompressor(algorithm: .deflate) }
        var input = ByteBuffer(bytes: wire + [0, 0, 0xFF, 0xFF])
        var result: [UInt8] = []
        while input.readableBytes > 0 {
            var output = ByteBufferAllocator().buffer(capacity: 65536)
            do {
                try inflater!.inflate(from: &input, to: &output)
            } catch let error as CompressNIOError where error == .bufferOverflow || error == .inputBufferOverflow {
            }
            if output.readableBytes == 0 && input.readableBytes > 0 {
                throw FakeBLIP.WireError(description: "inflate made no progress")
            }
            result += output.readableBytesView
        }
        return result
    }
}
