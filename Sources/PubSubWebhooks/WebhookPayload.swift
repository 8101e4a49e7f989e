import Bayeux
import NIOCore
import PubSubCore

/// The JSON of webhook posts: each event is encoded once, when it is queued; a batch is `{"events": [e1,e2,…]}`.
enum WebhookPayload {
    /// `{"type":"subscribe","clientId":"…","channel":"/a","user":null,"at":"2026-11-25T10:00:00.123Z"}`; a
    /// disconnect has `reason` and no `channel`, a handshake neither.
    static func encode(_ event: SessionEvent, at timestamp: String) -> ByteBuffer {
        var object: JSONObject = ["type": .string(event.kind.rawValue), "clientId": .string(event.clientId)]
        if let channel = event.channel { object["channel"] = .string(channel) }
        object["user"] = event.user.map(JSONValue.string) ?? .null
        if let reason = event.reason { object["reason"] = .string(reason.rawValue) }
        object["at"] = .string(timestamp)
        var buffer = ByteBufferAllocator().buffer(capacity: 160)
        buffer.writeJSON(object)
        return buffer
    }

    static func body(_ events: [ByteBuffer]) -> ByteBuffer {
        var body = ByteBufferAllocator().buffer(capacity: events.reduce(16) { $0 + $1.readableBytes + 1 })
        body.writeString("{\"events\":[")
        for (i, event) in events.enumerated() {
            if i > 0 { body.writeInteger(UInt8(ascii: ",")) }
            var event = event
            body.writeBuffer(&event)
        }
        body.writeString("]}")
        return body
    }
}
