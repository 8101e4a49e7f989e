import Bayeux

/// A grant as the engine stores it (`Engine.setGrant`): a small JSON object, so any node can read it back.
extension SessionGrant {
    public var encoded: String {
        var object: JSONObject = ["user": .string(user)]
        if let expiresAt { object["exp"] = .number(Self.number(expiresAt)) }
        object["channels"] = .array(channels.map { .string($0) })
        object["publish"] = .array(publish.map { .string($0) })
        return JSONValue.object(object).jsonString
    }

    public init?(encoded text: String) {
        guard let object = (try? JSONParser(maxDepth: 4).parse(text))?.objectValue,
            let user = object["user"]?.stringValue
        else { return nil }
        func strings(_ key: String) -> [String] { object[key]?.arrayValue?.compactMap(\.stringValue) ?? [] }
        self.init(
            user: user, expiresAt: object["exp"]?.doubleValue, channels: strings("channels"),
            publish: strings("publish"))
    }

    static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }
}
