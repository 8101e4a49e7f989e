import Bayeux
import NIOCore
import NIOPosix
import PubSubCore

extension PubSubServer {
    /// Publishes messages from inside the process (the relay of `pubsub serve --relay`), as one request of
    /// connection type `in-process`: they go through the same extensions as a publish over HTTP (so a secret's
    /// publish token is checked the same way) and are fanned out in order. Returns one reply per message, in
    /// order; a reply with `successful: false` carries the error.
    public func publishInProcess(_ messages: [Message]) async throws -> [Message] {
        let context = RequestContext(connectionType: .inProcess)
        let limit = max(1, configuration.broker.maxMessagesPerRequest)
        var replies: [Message] = []
        replies.reserveCapacity(messages.count)
        var start = 0
        while start < messages.count {
            let chunk = messages[start..<min(messages.count, start + limit)]
            start += chunk.count
            let loop = group.next()
            let outcomes = try await broker.handle(
                chunk.map { .message($0) }, context: context, sink: nil, now: .now(), on: loop
            ).get()
            for (message, outcome) in zip(chunk, outcomes) {
                switch outcome {
                case .reply(let reply):
                    replies.append(reply)
                case .connect, .none:
                    // An extension swallowed it (or it was not a publish): not acknowledged.
                    var reply = message.makeResponse()
                    reply.fail(.channelForbidden(message.channel ?? ""))
                    replies.append(reply)
                }
            }
        }
        return replies
    }
}
