import Bayeux

/// What `pubsub bench` runs: the shape of the load, how it is sent, and how long.
public enum Scenario: String, CaseIterable, Sendable {
    /// N subscribers on one channel; publishers at a fixed rate or as fast as the window allows.
    case fanout
    /// CometD's chat shape: C clients, R rooms, each client in K rooms; publishes to rooms in batches.
    case rooms
    /// N connected, subscribed clients held open; reports the server's memory per connection.
    case idle
    /// HTTP publish ingest: publishers POST publishes with no handshake (as a Rails app does), nobody listens.
    case publish
}

public enum Transport: String, CaseIterable, Sendable {
    case websocket
    case longPolling = "long-polling"
}

/// The protocol the load speaks: Bayeux (pubsub, Faye, CometD), or Centrifuge's JSON protocol over WebSocket (a
/// Centrifuge node, the Go library under Centrifugo), so that a peer that does not speak Bayeux is measured by the
/// same load.
public enum ServerProtocol: String, CaseIterable, Sendable {
    case bayeux
    case centrifuge
}

/// Where the server is: `http://host:port/path` (or `ws://`).
public struct BenchURL: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var path: String

    public init(host: String, port: Int, path: String) {
        self.host = host
        self.port = port
        self.path = path
    }

    /// Parses `http://127.0.0.1:9292/faye`, `ws://…`, or `127.0.0.1:9292/faye`. TLS is not supported.
    public init?(_ text: String) {
        var rest = Substring(text)
        let defaultPort = 80
        for scheme in ["http://", "ws://"] where rest.hasPrefix(scheme) {
            rest = rest.dropFirst(scheme.count)
        }
        if rest.hasPrefix("https://") || rest.hasPrefix("wss://") { return nil }
        let hostPort: Substring
        if let slash = rest.firstIndex(of: "/") {
            hostPort = rest[..<slash]
            path = String(rest[slash...])
        } else {
            hostPort = rest
            path = "/"
        }
        guard !hostPort.isEmpty, let authority = try? URLAuthority(hostPort), authority.user == nil,
            !authority.host.isEmpty
        else { return nil }
        host = authority.host
        port = authority.port ?? defaultPort
    }

    public var description: String { "http://\(host):\(port)\(path)" }
}

public struct BenchOptions: Sendable {
    public var url: BenchURL
    public var scenario: Scenario
    public var transport: Transport
    /// fanout: subscribers; rooms: clients; idle: connections; publish: optional listeners (usually 0).
    public var subscribers: Int
    public var publishers: Int
    public var rooms: Int
    public var roomsPerClient: Int
    /// Bytes of each message's `data` JSON.
    public var payloadBytes: Int
    /// Publishes per second over all publishers; 0 means as fast as acknowledgements and the window allow.
    public var rate: Double
    /// Publishes per frame or HTTP request.
    public var batch: Int
    /// As-fast-as-possible mode: publishes in flight (not yet acknowledged, or not yet received by every
    /// subscriber) over all publishers. Bounds every queue, so what is measured is throughput, not buffering.
    public var window: Int
    /// Seconds measured (idle: seconds held).
    public var duration: Double
    /// Publishes measured, instead of a duration.
    public var messages: Int?
    /// Seconds of load before measuring.
    public var warmup: Double
    /// Seconds to wait for outstanding deliveries after publishing stops.
    public var drain: Double
    /// Event-loop threads of the load generator.
    public var threads: Int
    /// Connections being opened at once.
    public var connectConcurrency: Int
    /// Seconds a connection may take to be handshaken and subscribed.
    public var connectTimeout: Double
    /// The server's process id, for CPU and memory (read from /proc; same machine only).
    public var serverPID: Int32?
    /// More endpoints beside `url` (brokers on other ports): client i connects to `targets[i % targets.count]`.
    public var moreURLs: [BenchURL] = []
    /// Local addresses the clients bind to before connecting, `perAddress` clients each in turn (127.0.0.2, …);
    /// empty lets the system choose.
    public var sourceAddresses: [String] = []
    public var perAddress: Int = 3000
    /// The channel prefix of the run; the worker processes of one run share it.
    public var runId: String?

    /// WebSocket clients offer permessage-deflate (RFC 7692) and inflate compressed messages (`--compression`).
    public var compression: Bool = BenchEnvironment.current.compression
    /// What each publish's `data` holds beside the marker (`--payload`): `--size` bytes of filler, or realistic
    /// JSON of its own size.
    public var payload: BenchPayload = BenchEnvironment.current.payload
    /// What the clients speak (`--protocol`).
    public var serverProtocol: ServerProtocol = .bayeux

    /// The run-wide number of this process's first client (a worker's share starts there), so that clients
    /// spread over `targets` as if one process held them all.
    public var firstIndex: Int = 0

    /// Every endpoint, `url` first.
    public var targets: [BenchURL] { [url] + moreURLs }

    /// Where client `index` connects and the address it binds to first.
    func endpoint(_ index: Int) -> (target: BenchURL, source: String?) {
        let all = targets
        let target = all[(firstIndex + index) % all.count]
        guard !sourceAddresses.isEmpty else { return (target, nil) }
        return (target, sourceAddresses[(index / max(1, perAddress)) % sourceAddresses.count])
    }

    public init(
        url: BenchURL = BenchURL(host: "127.0.0.1", port: 9292, path: "/faye"),
        scenario: Scenario = .fanout,
        transport: Transport = .websocket,
        subscribers: Int = 100,
        publishers: Int = 1,
        rooms: Int = 100,
        roomsPerClient: Int = 10,
        payloadBytes: Int = 64,
        rate: Double = 0,
        batch: Int = 1,
        window: Int = 16,
        duration: Double = 10,
        messages: Int? = nil,
        warmup: Double = 2,
        drain: Double = 10,
        threads: Int = 1,
        connectConcurrency: Int = 200,
        connectTimeout: Double = 60,
        serverPID: Int32? = nil
    ) {
        self.url = url
        self.scenario = scenario
        self.transport = transport
        self.subscribers = subscribers
        self.publishers = publishers
        self.rooms = rooms
        self.roomsPerClient = roomsPerClient
        self.payloadBytes = payloadBytes
        self.rate = rate
        self.batch = batch
        self.window = window
        self.duration = duration
        self.messages = messages
        self.warmup = warmup
        self.drain = drain
        self.threads = threads
        self.connectConcurrency = connectConcurrency
        self.connectTimeout = connectTimeout
        self.serverPID = serverPID
    }

    /// Checks the combination; returns a sentence for the first problem.
    public func problem() -> String? {
        if let problem = BenchEnvironment.current.problem { return problem }
        if subscribers < 0 { return "--subscribers must not be negative" }
        if publishers < 1 && scenario != .idle { return "--publishers must be at least 1" }
        if scenario == .rooms {
            if rooms < 1 { return "--rooms must be at least 1" }
            if roomsPerClient < 1 || roomsPerClient > rooms {
                return "--rooms-per-client must be between 1 and --rooms"
            }
        }
        if serverProtocol == .centrifuge {
            if scenario == .publish { return "--protocol centrifuge has no HTTP publish: use fanout, rooms or idle" }
            if transport != .websocket { return "--protocol centrifuge speaks WebSocket only" }
        }
        if scenario != .publish && subscribers < 1 { return "--subscribers must be at least 1" }
        if payloadBytes < 0 || payloadBytes > 1 << 20 { return "--size must be between 0 and 1048576" }
        if rate < 0 { return "--rate must not be negative" }
        if batch < 1 || batch > 1000 { return "--batch must be between 1 and 1000" }
        if window < 1 { return "--window must be at least 1" }
        if !(duration > 0) || duration > 3600 { return "--duration must be above 0 and at most 3600 seconds" }
        if let messages, messages < 1 { return "--messages must be at least 1" }
        if warmup < 0 || warmup > 600 { return "--warmup must be between 0 and 600 seconds" }
        if drain < 0 || drain > 600 { return "--drain must be between 0 and 600 seconds" }
        if threads < 1 || threads > 64 { return "--threads must be between 1 and 64" }
        if connectConcurrency < 1 { return "--connect-concurrency must be at least 1" }
        if perAddress < 1 { return "--per-address must be at least 1" }
        if !sourceAddresses.isEmpty, subscribers > perAddress * sourceAddresses.count {
            return
                "\(sourceAddresses.count) source addresses at --per-address \(perAddress) hold fewer than \(subscribers) connections"
        }
        return nil
    }
}
