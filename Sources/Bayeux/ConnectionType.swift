/// The connection types, in the exact order Faye advertises them.
public enum ConnectionType: String, Sendable, CaseIterable {
    case longPolling = "long-polling"
    case crossOriginLongPolling = "cross-origin-long-polling"
    case callbackPolling = "callback-polling"
    case websocket = "websocket"
    case eventSource = "eventsource"
    case inProcess = "in-process"

    public static let advertised: JSONValue = .array(allCases.map { .string($0.rawValue) })
}

/// The `advice` field of handshake and connect replies.
public enum Advice {
    /// `{"reconnect":"retry","interval":…,"timeout":…}` in milliseconds.
    public static func retry(intervalMilliseconds: Int64, timeoutMilliseconds: Int64) -> JSONValue {
        .object([
            "reconnect": "retry",
            "interval": .number(String(intervalMilliseconds)),
            "timeout": .number(String(timeoutMilliseconds)),
        ])
    }

    public static let handshake: JSONValue = .object(["reconnect": "handshake"])
}
