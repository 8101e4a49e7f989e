import Bayeux
import NIOCore

/// How messages reach the server. A transport sends messages and returns the replies to them; events that
/// arrive on the way (with a connect reply, or pushed on a WebSocket) go to the event handler, in order.
protocol BayeuxTransport: Sendable {
    /// The `connectionType` this transport announces.
    var connectionType: ConnectionType { get }
    /// Sends `messages` (each with a unique `id`) and returns the replies to them.
    func exchange(_ messages: [Message], timeout: TimeAmount) async throws -> [Message]
    /// Sends the batches in order, keeping up to `window` of them outstanding, and returns the replies to each.
    func exchangePipelined(_ batches: [[Message]], window: Int, timeout: TimeAmount) async throws -> [[Message]]
    /// Sends the groups together, in order, in one WebSocket frame or one HTTP request, and returns a handle on the
    /// replies to each group: on a WebSocket each group's replies come as soon as they are all in (the subscribes
    /// sent before a held connect are answered at once), over HTTP all of them with the one response. `timeouts[i]`
    /// bounds group `i`.
    func exchange(groups: [[Message]], timeouts: [TimeAmount]) async throws -> [PendingReplies]
    /// Whether the connection that carries events was lost (a WebSocket closed or failed) since the last call: the
    /// next connect is then a reconnect, and resumes every subscription first. Over HTTP a failed connect says so.
    func takeInterruption() -> Bool
    func close() async
}

/// The replies to one group of messages sent by `exchange(groups:timeouts:)`, or the failure of the exchange.
struct PendingReplies: Sendable {
    let future: EventLoopFuture<[Message]>
    /// Called when the task waiting for the replies is cancelled.
    let cancel: @Sendable () -> Void

    func get() async throws -> [Message] {
        try await withTaskCancellationHandler {
            try await future.get()
        } onCancel: {
            cancel()
        }
    }
}

/// Splits what the server sent into replies to `sent` and events.
enum ReplySorter {
    /// A reply carries `successful` and the `id` and `channel` of a message that was sent; an event is any other
    /// message on a non-meta channel (events carry their publisher's `id`, so the id alone does not tell).
    static func sort(_ received: [Message], sent: [Message]) -> (replies: [Message], events: [Message]) {
        var replies: [Message] = []
        var events: [Message] = []
        for message in received {
            let isReply =
                message["successful"] != nil
                && sent.contains { $0.id == message.id && ($0.channel == message.channel || message.channel == nil) }
            if isReply {
                replies.append(message)
            } else if let channel = message.channel, !Channel.isMeta(channel), message["successful"] == nil {
                events.append(message)
            }
        }
        return (replies, events)
    }

    /// Parses a response body: a JSON array of objects (or one object).
    static func parse(_ body: ByteBuffer) throws -> [Message] {
        let value: JSONValue
        do {
            value = try JSONParser(maxDepth: 512).parse(body)
        } catch {
            throw BayeuxClientError(.protocolError, "the server's answer is not JSON: \(preview(body))")
        }
        guard let elements = MessageBatch.elements(of: value) else {
            throw BayeuxClientError(
                .protocolError, "the server's answer is not a Bayeux message list: \(preview(body))")
        }
        return elements.compactMap {
            if case .message(let m) = $0 { return m }
            return nil
        }
    }

    static func encode(_ messages: [Message]) -> ByteBuffer {
        var buffer = ByteBufferAllocator().buffer(capacity: 256)
        buffer.writeJSON(.array(messages.map { .object($0.fields) }))
        return buffer
    }

    /// The first line of a body, shortened, for error messages.
    static func preview(_ body: ByteBuffer) -> String {
        let text = String(buffer: body)
        let line = text.split(whereSeparator: { $0 == "\n" || $0 == "\r" }).first.map(String.init) ?? ""
        return line.count > 200 ? String(line.prefix(200)) + "…" : line
    }
}
