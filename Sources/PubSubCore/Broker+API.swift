import Bayeux
import Logging
import NIOCore

/// What the server API asks of the broker: publishing without a client, removing a session, and the engine's
/// answers about channels, presence and history.
extension Broker {
    /// Why a publish of the server API was refused (its message becomes the `error` of a 400).
    public struct APIPublishError: Error, Sendable, Equatable {
        public var message: String

        public init(message: String) { self.message = message }
    }

    /// Publishes `data` on `channel` as a client's publish would be delivered (outgoing extensions included),
    /// without the incoming ones: the API key stands for the publish token. Completes with the event's position
    /// (nil without history, or when an outgoing extension swallowed the event).
    public func publishFromAPI(
        channel: String, data: JSONValue, ext: JSONValue?, now: NIODeadline, on loop: any EventLoop
    ) -> EventLoopFuture<Result<String?, APIPublishError>> {
        if let problem = validatePublishChannel(channel) { return loop.makeSucceededFuture(.failure(problem)) }
        if data.isNull { return loop.makeSucceededFuture(.failure(APIPublishError(message: "data is missing"))) }
        if let ext, ext.objectValue == nil {
            return loop.makeSucceededFuture(.failure(APIPublishError(message: "ext must be an object")))
        }
        var event = Message()
        event.channel = channel
        event["data"] = data
        if let ext { event.ext = ext.objectValue }
        guard let delivered = extensions.outgoingEvent(event) else { return loop.makeSucceededFuture(.success(nil)) }
        return engine.publish(delivered, to: channel, now: now, on: loop).map { .success($0) }
    }

    /// Nil when `channel` can be published to: a valid name (no wildcard), not a meta or service channel.
    public func validatePublishChannel(_ channel: String) -> APIPublishError? {
        if channel.utf8.count > configuration.maxChannelLength {
            return APIPublishError(message: "channel name too long (limit \(configuration.maxChannelLength) bytes)")
        }
        if !Channel.isValidName(channel) { return APIPublishError(message: "invalid channel name") }
        if Channel.isMeta(channel) || Channel.isService(channel) {
            return APIPublishError(message: "cannot publish to a meta or service channel")
        }
        return nil
    }

    /// Ends the session at once (`DetachReason.kicked`): its parked connect is answered with
    /// `advice.reconnect: "none"`. False when there was no such session.
    public func kick(_ clientId: String, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        engine.destroyClient(clientId, reason: .kicked, on: loop).map { existed in
            if existed {
                self.logger.info("client disconnected by the server API", metadata: ["pubsub.client.id": "\(clientId)"])
            }
            return existed
        }
    }
}
