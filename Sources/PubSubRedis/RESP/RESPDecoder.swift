import NIOCore

/// A pure RESP2 parser over a `ByteBuffer`, bounded in every dimension: it consumes one whole value, or
/// nothing when more bytes are needed, and throws on anything malformed or beyond its limits (the connection
/// is then closed; a parser that threw is not used again).
public struct RESPDecoder: Sendable {
    public struct Limits: Sendable, Hashable {
        /// Longest bulk string.
        public var maxBulkLength: Int
        /// Most elements in one array.
        public var maxArrayCount: Int
        /// Deepest nesting of arrays.
        public var maxDepth: Int
        /// Longest line: a simple string, an error or a length header.
        public var maxLineLength: Int

        public init(
            maxBulkLength: Int = 64 << 20, maxArrayCount: Int = 1 << 20, maxDepth: Int = 8,
            maxLineLength: Int = 64 << 10
        ) {
            self.maxBulkLength = maxBulkLength
            self.maxArrayCount = maxArrayCount
            self.maxDepth = maxDepth
            self.maxLineLength = maxLineLength
        }
    }

    public enum Error: Swift.Error, Hashable {
        case unknownType(UInt8)
        case invalidInteger
        case invalidLength
        case bulkTooLong
        case arrayTooLong
        case tooDeep
        case lineTooLong
        case missingCRLF
    }

    public let limits: Limits

    public init(limits: Limits = .init()) { self.limits = limits }

    /// Reads one value from the front of `buffer`; nil (and nothing consumed) when it is not complete yet.
    public func decode(_ buffer: inout ByteBuffer) throws -> RESPValue? {
        var offset = buffer.readerIndex
        guard let value = try parse(buffer, at: &offset, depth: 0) else { return nil }
        buffer.moveReaderIndex(to: offset)
        return value
    }

    private func parse(_ buffer: ByteBuffer, at offset: inout Int, depth: Int) throws -> RESPValue? {
        guard let type = buffer.getInteger(at: offset, as: UInt8.self) else { return nil }
        var cursor = offset + 1
        guard let line = try readLine(buffer, at: &cursor) else { return nil }
        switch type {
        case UInt8(ascii: "+"):
            offset = cursor
            return .simpleString(buffer.getSlice(at: line.lowerBound, length: line.count)!)
        case UInt8(ascii: "-"):
            offset = cursor
            return .error(buffer.getString(at: line.lowerBound, length: line.count)!)
        case UInt8(ascii: ":"):
            offset = cursor
            return .integer(try integer(buffer, line))
        case UInt8(ascii: "$"):
            let length = try integer(buffer, line)
            if length == -1 {
                offset = cursor
                return .bulkString(nil)
            }
            guard length >= 0 else { throw Error.invalidLength }
            guard length <= limits.maxBulkLength else { throw Error.bulkTooLong }
            let count = Int(length)
            guard buffer.writerIndex - cursor >= count + 2 else { return nil }
            guard buffer.getInteger(at: cursor + count, as: UInt16.self) == 0x0D0A else { throw Error.missingCRLF }
            let bytes = buffer.getSlice(at: cursor, length: count)!
            offset = cursor + count + 2
            return .bulkString(bytes)
        case UInt8(ascii: "*"):
            let length = try integer(buffer, line)
            if length == -1 {
                offset = cursor
                return .array(nil)
            }
            guard length >= 0 else { throw Error.invalidLength }
            guard length <= limits.maxArrayCount else { throw Error.arrayTooLong }
            guard depth < limits.maxDepth else { throw Error.tooDeep }
            // The count is only a claim until the elements arrive: reserve little.
            var elements: [RESPValue] = []
            elements.reserveCapacity(min(Int(length), 1024))
            for _ in 0..<length {
                guard let element = try parse(buffer, at: &cursor, depth: depth + 1) else { return nil }
                elements.append(element)
            }
            offset = cursor
            return .array(elements)
        default:
            throw Error.unknownType(type)
        }
    }

    /// The range of the line starting at `cursor` (without CRLF); moves `cursor` past the CRLF.
    private func readLine(_ buffer: ByteBuffer, at cursor: inout Int) throws -> Range<Int>? {
        let available = buffer.writerIndex - cursor
        guard available > 0 else { return nil }
        let window = min(available, limits.maxLineLength + 2)
        let view = buffer.readableBytesView
        let base = view.startIndex + (cursor - buffer.readerIndex)
        guard let cr = view[base..<(base + window)].firstIndex(of: 0x0D) else {
            if available > limits.maxLineLength + 1 { throw Error.lineTooLong }
            return nil
        }
        let crOffset = cursor + (cr - base)
        guard crOffset + 1 < buffer.writerIndex else { return nil }
        guard buffer.getInteger(at: crOffset + 1, as: UInt8.self) == 0x0A else { throw Error.missingCRLF }
        let range = cursor..<crOffset
        cursor = crOffset + 2
        return range
    }

    private func integer(_ buffer: ByteBuffer, _ line: Range<Int>) throws -> Int64 {
        guard !line.isEmpty, line.count <= 20 else { throw Error.invalidInteger }
        var negative = false
        var value: Int64 = 0
        var index = line.lowerBound
        if buffer.getInteger(at: index, as: UInt8.self) == UInt8(ascii: "-") {
            negative = true
            index += 1
            guard index < line.upperBound else { throw Error.invalidInteger }
        }
        while index < line.upperBound {
            let byte = buffer.getInteger(at: index, as: UInt8.self)!
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { throw Error.invalidInteger }
            let (times, o1) = value.multipliedReportingOverflow(by: 10)
            let (sum, o2) = times.addingReportingOverflow(Int64(byte - UInt8(ascii: "0")))
            guard !o1, !o2 else { throw Error.invalidInteger }
            value = sum
            index += 1
        }
        return negative ? -value : value
    }
}

/// The decoder as a NIO `ByteToMessageDecoder`.
struct RESPMessageDecoder: ByteToMessageDecoder {
    typealias InboundOut = RESPValue
    let decoder: RESPDecoder

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let value = try decoder.decode(&buffer) else { return .needMoreData }
        context.fireChannelRead(NIOAny(value))
        return .continue
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws
        -> DecodingState
    {
        try decode(context: context, buffer: &buffer)
    }
}
