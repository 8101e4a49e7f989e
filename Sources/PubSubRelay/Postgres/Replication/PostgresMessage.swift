import NIOCore

/// A message from a PostgreSQL server, as far as a replication connection reads them (the frontend/backend
/// protocol 3.0: a type byte, a length that counts itself, the body).
enum PostgresBackendMessage: Sendable, Equatable {
    enum Authentication: Sendable, Equatable {
        case ok
        case cleartextPassword
        case md5Password(salt: [UInt8])
        case sasl(mechanisms: [String])
        case saslContinue([UInt8])
        case saslFinal([UInt8])
        /// A method this client does not speak (Kerberos, GSSAPI, SSPI), by its code.
        case unsupported(Int32)
    }

    case authentication(Authentication)
    case parameterStatus(name: String, value: String)
    case backendKeyData
    case readyForQuery
    case error(PostgresServerError)
    case notice(PostgresServerError)
    case rowDescription
    case dataRow([String?])
    case commandComplete(String)
    case copyBothResponse
    case copyData(ByteBuffer)
    case copyDone
    /// Any other message, by its type byte (ignored where it may come, an error where it may not).
    case other(UInt8)
}

/// An ErrorResponse or NoticeResponse: its fields by their code (`S` severity, `C` SQLSTATE, `M` message).
struct PostgresServerError: Error, Sendable, Equatable, CustomStringConvertible {
    var fields: [UInt8: String]

    var sqlState: String { fields[UInt8(ascii: "C")] ?? "" }
    var message: String { fields[UInt8(ascii: "M")] ?? "unknown error" }
    var severity: String { fields[UInt8(ascii: "V")] ?? fields[UInt8(ascii: "S")] ?? "ERROR" }
    var description: String { message }
}

/// A message to the server. `sslRequest` and `startup` have no type byte.
enum PostgresFrontendMessage: Sendable, Equatable {
    case sslRequest
    case startup(parameters: [String: String])
    /// A PasswordMessage: cleartext, or the MD5 answer.
    case password(String)
    case saslInitialResponse(mechanism: String, data: [UInt8])
    case saslResponse([UInt8])
    case query(String)
    case copyData([UInt8])
    case terminate

    func encode(into buffer: inout ByteBuffer) {
        switch self {
        case .sslRequest:
            buffer.writeInteger(Int32(8))
            buffer.writeInteger(Int32(80_877_103))
        case .startup(let parameters):
            let start = buffer.writerIndex
            buffer.writeInteger(Int32(0))
            buffer.writeInteger(Int32(196_608))  // protocol 3.0
            // In a stable order, so that the bytes can be checked.
            for (name, value) in parameters.sorted(by: { $0.key < $1.key }) {
                buffer.writeNullTerminatedString(name)
                buffer.writeNullTerminatedString(value)
            }
            buffer.writeInteger(UInt8(0))
            buffer.setInteger(Int32(buffer.writerIndex - start), at: start)
        case .password(let text):
            Self.message(UInt8(ascii: "p"), into: &buffer) { $0.writeNullTerminatedString(text) }
        case .saslInitialResponse(let mechanism, let data):
            Self.message(UInt8(ascii: "p"), into: &buffer) {
                $0.writeNullTerminatedString(mechanism)
                $0.writeInteger(Int32(data.count))
                $0.writeBytes(data)
            }
        case .saslResponse(let data):
            Self.message(UInt8(ascii: "p"), into: &buffer) { $0.writeBytes(data) }
        case .query(let text):
            Self.message(UInt8(ascii: "Q"), into: &buffer) { $0.writeNullTerminatedString(text) }
        case .copyData(let data):
            Self.message(UInt8(ascii: "d"), into: &buffer) { $0.writeBytes(data) }
        case .terminate:
            Self.message(UInt8(ascii: "X"), into: &buffer) { _ in }
        }
    }

    private static func message(_ type: UInt8, into buffer: inout ByteBuffer, _ body: (inout ByteBuffer) -> Void) {
        buffer.writeInteger(type)
        let start = buffer.writerIndex
        buffer.writeInteger(Int32(0))
        body(&buffer)
        buffer.setInteger(Int32(buffer.writerIndex - start), at: start)
    }
}

/// Splits the server's bytes into messages. A message longer than `maxMessageSize` ends the connection with an error
/// rather than being buffered (a row is at most 1 GB in PostgreSQL; the relay holds one message whole).
struct PostgresBackendDecoder: NIOSingleStepByteToMessageDecoder {
    typealias InboundOut = PostgresBackendMessage

    var maxMessageSize: Int

    init(maxMessageSize: Int = 256 << 20) { self.maxMessageSize = maxMessageSize }

    mutating func decode(buffer: inout ByteBuffer) throws -> PostgresBackendMessage? {
        guard let type = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self),
            let length = buffer.getInteger(at: buffer.readerIndex + 1, as: Int32.self)
        else { return nil }
        guard length >= 4 else { throw PostgresProtocolError("a message with a bad length (\(length))") }
        guard Int(length) - 4 <= maxMessageSize else {
            throw PostgresProtocolError(
                "a message of \(length) bytes is larger than the relay's limit of \(maxMessageSize) bytes")
        }
        guard buffer.readableBytes >= 1 + Int(length) else { return nil }
        buffer.moveReaderIndex(forwardBy: 5)
        var body = buffer.readSlice(length: Int(length) - 4)!
        return try Self.parse(type: type, body: &body)
    }

    mutating func decodeLast(buffer: inout ByteBuffer, seenEOF: Bool) throws -> PostgresBackendMessage? {
        try decode(buffer: &buffer)
    }

    static func parse(type: UInt8, body: inout ByteBuffer) throws -> PostgresBackendMessage {
        switch type {
        case UInt8(ascii: "R"):
            guard let code = body.readInteger(as: Int32.self) else {
                throw PostgresProtocolError("a short Authentication")
            }
            switch code {
            case 0: return .authentication(.ok)
            case 3: return .authentication(.cleartextPassword)
            case 5:
                guard let salt = body.readBytes(length: 4) else {
                    throw PostgresProtocolError("an MD5 request without salt")
                }
                return .authentication(.md5Password(salt: salt))
            case 10:
                var mechanisms: [String] = []
                while let name = body.readNullTerminatedString(), !name.isEmpty { mechanisms.append(name) }
                return .authentication(.sasl(mechanisms: mechanisms))
            case 11: return .authentication(.saslContinue(body.readBytes(length: body.readableBytes) ?? []))
            case 12: return .authentication(.saslFinal(body.readBytes(length: body.readableBytes) ?? []))
            default: return .authentication(.unsupported(code))
            }
        case UInt8(ascii: "S"):
            guard let name = body.readNullTerminatedString(), let value = body.readNullTerminatedString() else {
                throw PostgresProtocolError("a bad ParameterStatus")
            }
            return .parameterStatus(name: name, value: value)
        case UInt8(ascii: "K"): return .backendKeyData
        case UInt8(ascii: "Z"): return .readyForQuery
        case UInt8(ascii: "E"), UInt8(ascii: "N"):
            var fields: [UInt8: String] = [:]
            while let code = body.readInteger(as: UInt8.self), code != 0 {
                guard let value = body.readNullTerminatedString() else { break }
                fields[code] = value
            }
            let error = PostgresServerError(fields: fields)
            return type == UInt8(ascii: "E") ? .error(error) : .notice(error)
        case UInt8(ascii: "T"): return .rowDescription
        case UInt8(ascii: "D"):
            guard let count = body.readInteger(as: Int16.self), count >= 0 else {
                throw PostgresProtocolError("a bad DataRow")
            }
            var cells: [String?] = []
            for _ in 0..<count {
                guard let length = body.readInteger(as: Int32.self) else {
                    throw PostgresProtocolError("a short DataRow")
                }
                if length < 0 {
                    cells.append(nil)
                } else {
                    guard let text = body.readString(length: Int(length)) else {
                        throw PostgresProtocolError("a short DataRow")
                    }
                    cells.append(text)
                }
            }
            return .dataRow(cells)
        case UInt8(ascii: "C"): return .commandComplete(body.readNullTerminatedString() ?? "")
        case UInt8(ascii: "W"): return .copyBothResponse
        case UInt8(ascii: "d"): return .copyData(body)
        case UInt8(ascii: "c"): return .copyDone
        default: return .other(type)
        }
    }
}

/// The server broke the protocol (or sent what this client does not expect).
struct PostgresProtocolError: Error, Sendable, Equatable, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = "PostgreSQL sent " + description }
}

/// Writes frontend messages.
struct PostgresFrontendEncoder: MessageToByteEncoder {
    typealias OutboundIn = PostgresFrontendMessage

    func encode(data: PostgresFrontendMessage, out: inout ByteBuffer) {
        data.encode(into: &out)
    }
}
