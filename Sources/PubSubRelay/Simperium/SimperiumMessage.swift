import Bayeux

/// One entry of an index page: an entity id and its current version.
public struct SimperiumIndexEntry: Sendable, Hashable {
    public var id: String
    public var version: Int64

    public init(id: String, version: Int64) {
        self.id = id
        self.version = version
    }
}

/// An index page, `{"current": cv, "index": [{"id", "v"}], "mark"?}`; a page without `mark` is the last one.
public struct SimperiumIndexPage: Sendable, Hashable {
    public var current: String
    public var entries: [SimperiumIndexEntry]
    public var mark: String?

    public init(current: String, entries: [SimperiumIndexEntry], mark: String?) {
        self.current = current
        self.entries = entries
        self.mark = mark
    }
}

/// A change object of a `c` message: `{clientid, cv, ev, sv?, id, o: "M"|"-", v, ccids, error?}`.
public struct SimperiumChange: Sendable, Hashable {
    public var id: String
    /// The bucket's change version after this change.
    public var cv: String
    /// The entity's version after this change (`ev`), and before it (`sv`; absent or 0 for a new entity).
    public var endVersion: Int64?
    public var sourceVersion: Int64?
    /// `M` (modify) or `-` (remove).
    public var operation: String
    public var clientID: String?
    /// The diff of the change (`v`), kept as JSON.
    public var diff: JSONValue?
    /// Set when the server reports an error for a change (405, 409, 412, 440) instead of a change.
    public var error: Int64?

    public init(
        id: String, cv: String, endVersion: Int64?, sourceVersion: Int64?, operation: String,
        clientID: String? = nil, diff: JSONValue? = nil, error: Int64? = nil
    ) {
        self.id = id
        self.cv = cv
        self.endVersion = endVersion
        self.sourceVersion = sourceVersion
        self.operation = operation
        self.clientID = clientID
        self.diff = diff
        self.error = error
    }

    /// `-` is a delete; `M` on an entity without a source version is an insert, any other `M` an update.
    public var changeOperation: Change.Operation {
        if operation == "-" { return .delete }
        if let sourceVersion, sourceVersion > 0 { return .update }
        return .insert
    }

    init(json value: JSONValue) throws {
        guard let object = value.objectValue else { throw RelayError(.simperiumProtocol, "a change is not an object") }
        if let code = object["error"], !code.isNull {
            self.init(
                id: object["id"]?.stringValue ?? "", cv: object["cv"]?.stringValue ?? "", endVersion: nil,
                sourceVersion: nil, operation: object["o"]?.stringValue ?? "",
                error: code.integerValue ?? -1)
            return
        }
        guard let id = object["id"]?.stringValue, !id.isEmpty else {
            throw RelayError(.simperiumProtocol, "a change has no id")
        }
        guard let cv = object["cv"]?.stringValue, !cv.isEmpty else {
            throw RelayError(.simperiumProtocol, "change of \(id) has no cv")
        }
        guard let operation = object["o"]?.stringValue, operation == "M" || operation == "-" else {
            throw RelayError(.simperiumProtocol, "change of \(id) has no operation o of M or -")
        }
        func version(_ key: String) throws -> Int64? {
            guard let value = object[key], !value.isNull else { return nil }
            guard let int = value.integerValue else {
                throw RelayError(.simperiumProtocol, "change of \(id): \(key) is not an integer")
            }
            return int
        }
        self.init(
            id: id, cv: cv, endVersion: try version("ev"), sourceVersion: try version("sv"),
            operation: operation, clientID: object["clientid"]?.stringValue, diff: object["v"])
    }
}

/// A message from a Simperium server, with its channel prefix removed.
public enum SimperiumServerMessage: Sendable, Hashable {
    /// `auth:<user>`: the token was accepted.
    case authenticated(user: String)
    /// `auth:expired` or `auth:{"msg", "code"}`: the token was refused.
    case authenticationFailed(reason: String)
    /// `i:{…}`: one index page.
    case index(SimperiumIndexPage)
    /// `c:[…]`: changes, after a `cv` request or pushed live.
    case changes([SimperiumChange])
    /// `cv:?` or `c:?`: the server does not know the requested change version.
    case unknownVersion
    /// `e:<id>.<v>\n<json>` or `e:<id>.<v>\n?`.
    case entity(key: String, data: JSONValue?)
    /// `h:<n>`: the answer to a heartbeat.
    case heartbeat(Int64)
}

/// The text framing of the Simperium streaming API: `[<channel>:]<command>:<body>`; the heartbeat `h:<n>` carries
/// no channel.
public enum SimperiumMessage {
    /// Splits `0:c:[…]` into (channel 0, "c", "[…]"); `h:3` into (nil, "h", "3").
    public static func split(_ text: String) throws -> (channel: Int?, command: String, body: Substring) {
        var rest = Substring(text)
        var channel: Int?
        if let colon = rest.firstIndex(of: ":"), !rest[..<colon].isEmpty,
            rest[..<colon].allSatisfy({ $0.isASCII && $0.isNumber })
        {
            guard let number = Int(rest[..<colon]) else {
                throw RelayError(.simperiumProtocol, "bad channel prefix in \(preview(text))")
            }
            channel = number
            rest = rest[rest.index(after: colon)...]
        }
        guard let colon = rest.firstIndex(of: ":") else {
            throw RelayError(.simperiumProtocol, "message without a command: \(preview(text))")
        }
        let command = String(rest[..<colon])
        guard !command.isEmpty else {
            throw RelayError(.simperiumProtocol, "message without a command: \(preview(text))")
        }
        return (channel, command, rest[rest.index(after: colon)...])
    }

    /// Decodes one text message from the server.
    public static func decode(_ text: String) throws -> (channel: Int?, message: SimperiumServerMessage) {
        let (channel, command, body) = try split(text)
        switch command {
        case "h":
            guard let count = Int64(body) else {
                throw RelayError(.simperiumProtocol, "bad heartbeat \(preview(text))")
            }
            return (channel, .heartbeat(count))
        case "auth":
            if body == "expired" { return (channel, .authenticationFailed(reason: "the token has expired")) }
            if body.hasPrefix("{") {
                let object = try parseJSON(body, what: "auth error").objectValue
                let message = object?["msg"]?.stringValue ?? String(body)
                let code = object?["code"].flatMap { $0.integerValue }.map { " (\($0))" } ?? ""
                return (channel, .authenticationFailed(reason: message + code))
            }
            guard !body.isEmpty else { throw RelayError(.simperiumProtocol, "empty auth reply") }
            return (channel, .authenticated(user: String(body)))
        case "cv":
            guard body == "?" else { throw RelayError(.simperiumProtocol, "unexpected cv message \(preview(text))") }
            return (channel, .unknownVersion)
        case "c" where body == "?":
            return (channel, .unknownVersion)
        case "c":
            guard let array = try parseJSON(body, what: "changes").arrayValue else {
                throw RelayError(.simperiumProtocol, "changes are not an array: \(preview(text))")
            }
            return (channel, .changes(try array.map(SimperiumChange.init(json:))))
        case "i":
            guard let object = try parseJSON(body, what: "index page").objectValue else {
                throw RelayError(.simperiumProtocol, "index page is not an object: \(preview(text))")
            }
            guard let current = object["current"]?.stringValue else {
                throw RelayError(.simperiumProtocol, "index page without current: \(preview(text))")
            }
            guard let index = object["index"]?.arrayValue else {
                throw RelayError(.simperiumProtocol, "index page without index: \(preview(text))")
            }
            let entries = try index.map { value -> SimperiumIndexEntry in
                guard let entry = value.objectValue, let id = entry["id"]?.stringValue,
                    let version = entry["v"]?.integerValue
                else { throw RelayError(.simperiumProtocol, "index entry without id and v: \(value.jsonString)") }
                return SimperiumIndexEntry(id: id, version: version)
            }
            let mark = object["mark"].flatMap { $0.stringValue }.flatMap { $0.isEmpty ? nil : $0 }
            return (channel, .index(SimperiumIndexPage(current: current, entries: entries, mark: mark)))
        case "e":
            guard let newline = body.firstIndex(of: "\n") else {
                throw RelayError(.simperiumProtocol, "entity without a body: \(preview(text))")
            }
            let key = String(body[..<newline])
            let rest = body[body.index(after: newline)...]
            if rest == "?" { return (channel, .entity(key: key, data: nil)) }
            return (channel, .entity(key: key, data: try parseJSON(rest, what: "entity")))
        default:
            throw RelayError(.simperiumProtocol, "unknown command \(command) in \(preview(text))")
        }
    }

    /// `0:init:{…}`: opens a bucket with a token.
    public static func initialize(
        channel: Int = 0, clientID: String, token: String, appID: String, bucket: String,
        library: String = "pubsub-relay", version: String = "1"
    ) -> String {
        let object: JSONObject = [
            "api": 1, "clientid": .string(clientID), "token": .string(token), "app_id": .string(appID),
            "name": .string(bucket), "library": .string(library), "version": .string(version),
        ]
        return "\(channel):init:\(object.jsonString)"
    }

    /// `0:i::<mark>::<limit>`: one index page, starting at `mark` (nil: the first page).
    public static func index(channel: Int = 0, mark: String?, limit: Int) -> String {
        "\(channel):i::\(mark ?? "")::\(limit)"
    }

    /// `0:cv:<cv>`: the changes after `cv`.
    public static func changesSince(channel: Int = 0, cv: String) -> String { "\(channel):cv:\(cv)" }

    /// `0:e:<id>.<v>`: one entity version.
    public static func entity(channel: Int = 0, id: String, version: Int64) -> String {
        "\(channel):e:\(id).\(version)"
    }

    /// `h:<n>`, without a channel.
    public static func heartbeat(_ count: Int64) -> String { "h:\(count)" }

    static func parseJSON(_ text: Substring, what: String) throws -> JSONValue {
        do {
            return try JSONParser().parse(Array(text.utf8))
        } catch {
            throw RelayError(.simperiumProtocol, "malformed \(what) JSON (\(error)): \(preview(String(text)))")
        }
    }

    static func preview(_ text: String) -> String {
        text.count <= 120 ? text : String(text.prefix(120)) + "…"
    }
}
