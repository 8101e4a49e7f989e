import Bayeux

/// What an extension knows about where a message came from.
public struct RequestContext: Sendable {
    public var connectionType: ConnectionType
    public var remoteAddress: String?
    /// The headers of the HTTP request or WebSocket upgrade that carried the message, by lowercased name, for
    /// the authorizers: only those in `RequestContext.forwardedHeaders`.
    public var headers: [String: String]

    /// The headers an authorizer may see (the hook forwards them to the app).
    public static let forwardedHeaders = ["cookie", "authorization", "origin", "user-agent"]

    public init(connectionType: ConnectionType, remoteAddress: String? = nil, headers: [String: String] = [:]) {
        self.connectionType = connectionType
        self.remoteAddress = remoteAddress
        self.headers = headers
    }
}

/// A server extension, as in Faye: `incoming` sees every message before it is handled, `outgoing` every reply.
///
/// Setting `message.error` on incoming vetoes the action (the reply carries that error); returning false
/// swallows the message (no reply). Extensions run synchronously, in the order they were added, for both
/// stages. Unlike Faye, `outgoingEvent` sees a published event once, before it is encoded for all of its
/// recipients, not once per recipient: that is what lets a publish be encoded once.
public protocol BayeuxExtension: Sendable {
    func incoming(_ message: inout Message, context: RequestContext) -> Bool
    func outgoing(_ reply: inout Message, context: RequestContext) -> Bool
    func outgoingEvent(_ event: inout Message) -> Bool
}

extension BayeuxExtension {
    public func incoming(_ message: inout Message, context: RequestContext) -> Bool { true }
    public func outgoing(_ reply: inout Message, context: RequestContext) -> Bool { true }
    public func outgoingEvent(_ event: inout Message) -> Bool { true }
}

/// The ordered list of extensions.
public struct ExtensionPipeline: Sendable {
    public var extensions: [any BayeuxExtension]
    /// The authorization modes, asked after the extensions' `incoming` (see `Broker+Authorization`).
    public var authorization: AuthorizationPipeline

    public init(_ extensions: [any BayeuxExtension] = [], authorization: AuthorizationPipeline = .init()) {
        self.extensions = extensions
        self.authorization = authorization
    }

    public func incoming(_ message: Message, context: RequestContext) -> Message? {
        var message = message
        for e in extensions where !e.incoming(&message, context: context) { return nil }
        return message
    }

    public func outgoing(_ reply: Message, context: RequestContext) -> Message? {
        var reply = reply
        for e in extensions where !e.outgoing(&reply, context: context) { return nil }
        return reply
    }

    public func outgoingEvent(_ event: Message) -> Message? {
        var event = event
        for e in extensions where !e.outgoingEvent(&event) { return nil }
        return event
    }
}
