/// A Bayeux message: a JSON object with typed access to the envelope. Unknown fields are kept, because
/// Faye forwards them to subscribers verbatim.
public struct Message: Sendable, Hashable {
    public var fields: JSONObject

    public init(_ fields: JSONObject = JSONObject()) { self.fields = fields }

    public subscript(key: String) -> JSONValue? {
        get { fields[key] }
        set { fields[key] = newValue }
    }

    public var channel: String? {
        get { fields["channel"]?.stringValue }
        set { fields["channel"] = newValue.map { .string($0) } }
    }

    /// The client id, when it is a string (a non-string id is as good as absent).
    public var clientId: String? {
        get { fields["clientId"]?.stringValue }
        set { fields["clientId"] = newValue.map { .string($0) } }
    }

    /// The message id, echoed as sent (Faye clients send strings, some iOS clients numbers).
    public var id: JSONValue? { fields["id"] }

    public var data: JSONValue? { fields["data"] }

    public var ext: JSONObject? {
        get { fields["ext"]?.objectValue }
        set { fields["ext"] = newValue.map { .object($0) } }
    }

    public var error: String? {
        get { fields["error"]?.stringValue }
        set { fields["error"] = newValue.map { .string($0) } }
    }

    public var isMeta: Bool { channel.map(Channel.isMeta) ?? false }

    /// Faye's `make_response`: `id`, `clientId`, `channel` and `error` copied when present,
    /// `successful` = no error. `ext` is never copied.
    public func makeResponse() -> Message {
        var response = JSONObject()
        // The copied fields, `successful` and the one a reply adds most (`advice`, `subscription`), without
        // growing twice: a held connect keeps its reply as long as it is held.
        response.reserveCapacity(6)
        if let id = fields["id"] { response["id"] = id }
        if let clientId = fields["clientId"] { response["clientId"] = clientId }
        if let channel = fields["channel"] { response["channel"] = channel }
        if let error = fields["error"] { response["error"] = error }
        response["successful"] = .bool(fields["error"] == nil)
        return Message(response)
    }

    public mutating func fail(_ error: BayeuxError) {
        fail(error.description)
    }

    public mutating func fail(_ error: String) {
        fields["error"] = .string(error)
        fields["successful"] = .bool(false)
    }
}

/// How a request body becomes messages: one object or an array of objects. Elements that are not objects
/// are kept, so that each can be answered with an error reply instead of being dropped.
public enum MessageBatch {
    public enum Element: Sendable {
        case message(Message)
        case invalid(JSONValue)
    }

    /// Returns nil when the top level is neither an object nor an array (a transport error: HTTP 400).
    /// Nested arrays are flattened, as Faye (Ruby) does: `[[{…}],[{…}]]` is two messages.
    public static func elements(of value: JSONValue) -> [Element]? {
        switch value {
        case .object(let object): return [.message(Message(object))]
        case .array(let values):
            var elements: [Element] = []
            elements.reserveCapacity(values.count)
            flatten(values, into: &elements)
            return elements
        default: return nil
        }
    }

    private static func flatten(_ values: [JSONValue], into elements: inout [Element]) {
        for value in values {
            switch value {
            case .object(let object): elements.append(.message(Message(object)))
            case .array(let inner): flatten(inner, into: &elements)
            default: elements.append(.invalid(value))
            }
        }
    }
}
