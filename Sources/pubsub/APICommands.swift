import ArgumentParser
import Bayeux
import PubSubClient

/// Where the API commands connect and with which key: the broker URL of the other commands and `--api-key`.
struct APIOptions: ParsableArguments {
    @Option(
        name: [.customLong("url"), .customLong("server")],
        help:
            "The broker's Bayeux endpoint; the API is at the same origin (PUBSUB_URL; default http://127.0.0.1:9292/faye)."
    )
    var url: String?
    @Option(help: "The server API key (PUBSUB_API_KEY).") var apiKey: String?
    @Option(help: "A PEM file of certificate authorities to trust for https:// (PUBSUB_CA_FILE).") var caFile: String?
    @Flag(help: "Print the server's JSON answer as it is.") var json = false

    func client() throws -> ServerAPIClient {
        guard let key = apiKey ?? Environment.string("PUBSUB_API_KEY") else {
            throw failure("an API key is needed: --api-key or PUBSUB_API_KEY", ExitStatus.usage)
        }
        let url = self.url ?? Environment.string("PUBSUB_URL") ?? ClientOptions.defaultURL
        do {
            return try ServerAPIClient(url: url, key: key, trustRoots: caFile ?? Environment.string("PUBSUB_CA_FILE"))
        } catch {
            throw failure(error.message, ExitStatus.usage)
        }
    }

    /// Runs one call, mapping errors to exit statuses (401: refused; unreachable or another status: unavailable).
    func call(_ body: (ServerAPIClient) async throws -> JSONValue) async throws -> JSONValue {
        let client = try client()
        do {
            return try await body(client)
        } catch let error as BayeuxClientError {
            if error.code == .httpStatus, error.message.hasPrefix("401") {
                throw failure("refused by the server: " + error.message, ExitStatus.refused)
            }
            if error.code == .httpStatus, error.message.hasPrefix("404") {
                throw failure(
                    "no server API there (is the broker started with --api-key?): " + error.message,
                    ExitStatus.unavailable)
            }
            throw failure(error)
        }
    }
}

/// Refreshing output for `--watch`: the screen is cleared and the table printed again every interval.
struct WatchOptions: ParsableArguments {
    @Flag(help: "Refresh the table until interrupted.") var watch = false
    @Option(help: "Seconds between refreshes with --watch.") var every: Double = 2

    func validate() throws {
        guard every >= 0.2, every <= 3600 else { throw ValidationError("--every must be between 0.2 and 3600 seconds") }
    }

    func run(_ render: () async throws -> String) async throws {
        guard watch else {
            writeLine(try await render())
            return
        }
        while true {
            let text = try await render()
            writeLine("\u{1B}[H\u{1B}[2J" + text)
            try await Task.sleep(nanoseconds: UInt64(every * 1e9))
        }
    }
}

/// Left-aligned columns, a header line first.
func table(_ header: [String], _ rows: [[String]]) -> String {
    var widths = header.map(\.count)
    for row in rows { for (i, cell) in row.enumerated() { widths[i] = max(widths[i], cell.count) } }
    func line(_ cells: [String]) -> String {
        cells.enumerated().map { i, c in i == cells.count - 1 ? c : c.padding(toLength: widths[i] + 2) }.joined()
    }
    return ([line(header)] + rows.map(line)).joined(separator: "\n")
}

extension String {
    fileprivate func padding(toLength length: Int) -> String {
        count >= length ? self : self + String(repeating: " ", count: length - count)
    }
}

func text(_ value: JSONValue?) -> String {
    switch value {
    case .string(let s)?: return s
    case .number(let n)?: return n
    case .bool(let b)?: return String(b)
    case .null?, nil: return "-"
    case let v?: return v.jsonString
    }
}

struct Channels: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List subscribed channels and their subscriber counts (server API).")
    @Option(help: "Only names matching this pattern (/jobs/**).") var pattern: String?
    @OptionGroup var api: APIOptions
    @OptionGroup var watching: WatchOptions

    func run() async throws {
        try await watching.run {
            let answer = try await api.call {
                try await $0.get("channels", query: pattern.map { [("pattern", $0)] } ?? [])
            }
            if api.json { return answer.jsonString }
            let rows = (answer.objectValue?["channels"]?.arrayValue ?? []).map {
                [text($0.objectValue?["subscribers"]), text($0.objectValue?["channel"])]
            }
            return table(["SUBSCRIBERS", "CHANNEL"], rows)
        }
    }
}

struct Presence: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List the clients subscribed to a channel (server API).")
    @Argument(help: "The channel name (or pattern, as subscribed).") var channel: String
    @OptionGroup var api: APIOptions
    @OptionGroup var watching: WatchOptions

    func validate() throws {
        guard channel.hasPrefix("/") else { throw ValidationError("a channel starts with /") }
    }

    func run() async throws {
        try await watching.run {
            let answer = try await api.call { try await $0.get("presence", query: [("channel", channel)]) }
            if api.json { return answer.jsonString }
            let rows = (answer.objectValue?["clients"]?.arrayValue ?? []).map { c in
                ["clientId", "user", "transport", "since"].map { text(c.objectValue?[$0]) }
            }
            return table(["CLIENT", "USER", "TRANSPORT", "SINCE"], rows)
        }
    }
}

struct Info: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the broker's nodes, clients and rates (server API).")
    @OptionGroup var api: APIOptions
    @OptionGroup var watching: WatchOptions

    func run() async throws {
        try await watching.run {
            let answer = try await api.call { try await $0.get("info") }
            if api.json { return answer.jsonString }
            let rows = (answer.objectValue?["nodes"]?.arrayValue ?? []).map { n -> [String] in
                let o = n.objectValue
                let clients = (o?["clients"]?.objectValue?.entries ?? []).map { "\($0.key)=\(text($0.value))" }
                let rates = o?["rates"]?.objectValue
                return [
                    text(o?["id"]), text(o?["uptimeSeconds"]), text(o?["sessions"]), text(o?["subscriptions"]),
                    text(rates?["publishesPerSecond"]), text(rates?["deliveriesPerSecond"]),
                    text(rates?["dropsPerSecond"]),
                    clients.isEmpty ? "-" : clients.joined(separator: " "),
                ]
            }
            return table(["NODE", "UPTIME", "CLIENTS", "SUBS", "PUB/S", "DELIV/S", "DROP/S", "TRANSPORTS"], rows)
                + "\ntotal clients: \(text(answer.objectValue?["clients"]))"
        }
    }
}

struct Disconnect: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "End a client's session at once; it is told not to reconnect on its own (server API).")
    @Argument(help: "The client id.") var clientId: String
    @OptionGroup var api: APIOptions

    func run() async throws {
        let answer = try await api.call {
            try await $0.post("disconnect", body: .object(["clientId": .string(clientId)]))
        }
        if api.json { writeLine(answer.jsonString) }
        guard answer.objectValue?["disconnected"] == .bool(true) else {
            throw failure("no such client: \(clientId)", ExitStatus.refused)
        }
        if !api.json { writeLine("disconnected \(clientId)") }
    }
}
