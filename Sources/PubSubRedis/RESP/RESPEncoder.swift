import NIOCore

/// Writes RESP2: commands as arrays of bulk strings, and any value (for tests and fakes).
public enum RESPEncoder {
    public static func write(_ command: RESPCommand, into buffer: inout ByteBuffer) {
        buffer.writeInteger(UInt8(ascii: "*"))
        writeDecimal(Int64(command.arguments.count), into: &buffer)
        buffer.writeCRLF()
        for argument in command.arguments {
            switch argument {
            case .string(let s):
                buffer.writeInteger(UInt8(ascii: "$"))
                writeDecimal(Int64(s.utf8.count), into: &buffer)
                buffer.writeCRLF()
                buffer.writeString(s)
            case .bytes(let b):
                buffer.writeInteger(UInt8(ascii: "$"))
                writeDecimal(Int64(b.readableBytes), into: &buffer)
                buffer.writeCRLF()
                buffer.writeImmutableBuffer(b)
            case .integer(let i):
                var digits = ByteBuffer()
                writeDecimal(i, into: &digits)
                buffer.writeInteger(UInt8(ascii: "$"))
                writeDecimal(Int64(digits.readableBytes), into: &buffer)
                buffer.writeCRLF()
                buffer.writeBuffer(&digits)
            }
            buffer.writeCRLF()
        }
    }

    public static func write(_ value: RESPValue, into buffer: inout ByteBuffer) {
        switch value {
        case .simpleString(let s):
            buffer.writeInteger(UInt8(ascii: "+"))
            buffer.writeImmutableBuffer(s)
        case .error(let e):
            buffer.writeInteger(UInt8(ascii: "-"))
            buffer.writeString(e)
        case .integer(let i):
            buffer.writeInteger(UInt8(ascii: ":"))
            writeDecimal(i, into: &buffer)
        case .bulkString(nil):
            buffer.writeString("$-1")
        case .bulkString(let b?):
            buffer.writeInteger(UInt8(ascii: "$"))
            writeDecimal(Int64(b.readableBytes), into: &buffer)
            buffer.writeCRLF()
            buffer.writeImmutableBuffer(b)
        case .array(nil):
            buffer.writeString("*-1")
        case .array(let elements?):
            buffer.writeInteger(UInt8(ascii: "*"))
            writeDecimal(Int64(elements.count), into: &buffer)
            buffer.writeCRLF()
            for element in elements { write(element, into: &buffer) }
            return
        }
        buffer.writeCRLF()
    }

    static func writeDecimal(_ value: Int64, into buffer: inout ByteBuffer) {
        if value == 0 {
            buffer.writeInteger(UInt8(ascii: "0"))
            return
        }
        var magnitude = value.magnitude
        var digits:
            (
                UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8
            ) =
                (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var count = 0
        withUnsafeMutableBytes(of: &digits) { raw in
            while magnitude > 0 {
                raw[19 - count] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
                count += 1
            }
            if value < 0 { buffer.writeInteger(UInt8(ascii: "-")) }
            buffer.writeBytes(UnsafeRawBufferPointer(rebasing: raw[(20 - count)...]))
        }
    }
}

extension ByteBuffer {
    @inline(__always) mutating func writeCRLF() {
        writeInteger(UInt16(0x0D0A), endianness: .big)
    }
}
