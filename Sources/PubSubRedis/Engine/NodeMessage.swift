import NIOCore

/// What nodes tell each other through their Redis notification channels: a type byte, then fields written as
/// `<length>:<bytes>` (so any byte may appear in a field).
enum NodeMessage: Sendable, Equatable {
    /// A published event routed to this node.
    case event(sequence: UInt64, channel: String, event: ByteBuffer)
    /// A session moved here: its subscriptions, and whether it has connected before.
    case adopt(clientId: String, connectedBefore: Bool, subscriptions: [String])
    /// A session moved to `node`: hand its queue over.
    case move(clientId: String, node: String)
    /// The queue of a session that moved here, from its former node.
    case handoff(clientId: String, events: [ByteBuffer])
    /// Channels added to a session, then the events replayed for a resume, then the channels of a recovered
    /// resume (what the session kept of them is superseded by the range).
    case subscribed(clientId: String, channels: [String], events: [ByteBuffer], resumed: [String])
    case unsubscribed(clientId: String, channels: [String])
    case destroyed(clientId: String, reason: String)
    /// Everything sent before it has been received (tests and `settle`).
    case barrier(UInt64)

    static func parse(_ buffer: ByteBuffer) -> NodeMessage? {
        var reader = Reader(buffer: buffer)
        guard let type = reader.buffer.readInteger(as: UInt8.self) else { return nil }
        switch type {
        case UInt8(ascii: "E"):
            guard let seq = reader.integer(), let channel = reader.string(), let event = reader.field() else {
                return nil
            }
            return .event(sequence: seq, channel: channel, event: event)
        case UInt8(ascii: "A"):
            guard let id = reader.string(), let connected = reader.string(), let subs = reader.strings() else {
                return nil
            }
            return .adopt(clientId: id, connectedBefore: connected == "1", subscriptions: subs)
        case UInt8(ascii: "M"):
            guard let id = reader.string(), let node = reader.string() else { return nil }
            return .move(clientId: id, node: node)
        case UInt8(ascii: "H"):
            guard let id = reader.string(), let events = reader.fields() else { return nil }
            return .handoff(clientId: id, events: events)
        case UInt8(ascii: "S"):
            guard let id = reader.string(), let channels = reader.strings(), let events = reader.fields() else {
                return nil
            }
            // Absent when the resume was not recovered.
            let resumed = reader.buffer.readableBytes > 0 ? reader.strings() : []
            guard let resumed else { return nil }
            return .subscribed(clientId: id, channels: channels, events: events, resumed: resumed)
        case UInt8(ascii: "U"):
            guard let id = reader.string(), let channels = reader.strings() else { return nil }
            return .unsubscribed(clientId: id, channels: channels)
        case UInt8(ascii: "D"):
            guard let id = reader.string(), let reason = reader.string() else { return nil }
            return .destroyed(clientId: id, reason: reason)
        case UInt8(ascii: "B"):
            guard let n = reader.integer() else { return nil }
            return .barrier(n)
        default:
            return nil
        }
    }

    /// Only the messages a node itself sends (the rest are written by the scripts).
    func encoded() -> ByteBuffer {
        var out = ByteBuffer()
        switch self {
        case .handoff(let id, let events):
            out.writeString("H")
            Self.write(id, into: &out)
            Self.write(String(events.count), into: &out)
            for event in events { Self.write(event, into: &out) }
        case .barrier(let n):
            out.writeString("B")
            Self.write(String(n), into: &out)
        case .move(let id, let node):
            out.writeString("M")
            Self.write(id, into: &out)
            Self.write(node, into: &out)
        case .destroyed(let id, let reason):
            out.writeString("D")
            Self.write(id, into: &out)
            Self.write(reason, into: &out)
        case .event(let seq, let channel, let event):
            out.writeString("E")
            Self.write(String(seq), into: &out)
            Self.write(channel, into: &out)
            Self.write(event, into: &out)
        case .adopt(let id, let connected, let subs):
            out.writeString("A")
            Self.write(id, into: &out)
            Self.write(connected ? "1" : "0", into: &out)
            Self.write(String(subs.count), into: &out)
            for s in subs { Self.write(s, into: &out) }
        case .subscribed(let id, let channels, let events, let resumed):
            out.writeString("S")
            Self.write(id, into: &out)
            Self.write(String(channels.count), into: &out)
            for c in channels { Self.write(c, into: &out) }
            Self.write(String(events.count), into: &out)
            for e in events { Self.write(e, into: &out) }
            if !resumed.isEmpty {
                Self.write(String(resumed.count), into: &out)
                for c in resumed { Self.write(c, into: &out) }
            }
        case .unsubscribed(let id, let channels):
            out.writeString("U")
            Self.write(id, into: &out)
            Self.write(String(channels.count), into: &out)
            for c in channels { Self.write(c, into: &out) }
        }
        return out
    }

    static func write(_ string: String, into out: inout ByteBuffer) {
        out.writeString(String(string.utf8.count))
        out.writeString(":")
        out.writeString(string)
    }

    static func write(_ bytes: ByteBuffer, into out: inout ByteBuffer) {
        out.writeString(String(bytes.readableBytes))
        out.writeString(":")
        out.writeImmutableBuffer(bytes)
    }

    /// Reads `<length>:<bytes>` fields; nil on anything malformed.
    struct Reader {
        var buffer: ByteBuffer

        mutating func field() -> ByteBuffer? {
            var length = 0
            var digits = 0
            while let byte = buffer.readInteger(as: UInt8.self) {
                if byte == UInt8(ascii: ":") {
                    guard digits > 0 else { return nil }
                    return buffer.readSlice(length: length)
                }
                guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9"), digits < 10 else { return nil }
                length = length * 10 + Int(byte - UInt8(ascii: "0"))
                digits += 1
            }
            return nil
        }

        mutating func string() -> String? { field().map { String(buffer: $0) } }

        mutating func integer() -> UInt64? { string().flatMap { UInt64($0) } }

        mutating func strings() -> [String]? {
            guard let count = integer(), count <= 1 << 20 else { return nil }
            var out: [String] = []
            for _ in 0..<count {
                guard let s = string() else { return nil }
                out.append(s)
            }
            return out
        }

        mutating func fields() -> [ByteBuffer]? {
            guard let count = integer(), count <= 1 << 20 else { return nil }
            var out: [ByteBuffer] = []
            for _ in 0..<count {
                guard let s = field() else { return nil }
                out.append(s)
            }
            return out
        }
    }
}
