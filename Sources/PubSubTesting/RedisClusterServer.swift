import Foundation
import NIOCore
import NIOPosix
import PubSubRedis

/// A real Redis Cluster on loopback: `masters` redis-server processes in cluster mode (each with `replicas`
/// replicas), joined with `redis-cli --cluster create`, ready when every node says `cluster_state:ok`. Not
/// starting is a failure, never a skip.
// @unchecked: immutable after start: its servers.
public final class RedisClusterServer: @unchecked Sendable {
    public let nodes: [RedisServer]

    public var seeds: [RedisEndpoint] { nodes.map { RedisEndpoint(host: "127.0.0.1", port: $0.port) } }

    public static func start(masters: Int = 3, replicas: Int = 0) async throws -> RedisClusterServer {
        var nodes: [RedisServer] = []
        do {
            for _ in 0..<(masters * (1 + replicas)) {
                let bus = try RedisServer.freePort()
                nodes.append(
                    try await RedisServer.start(arguments: [
                        "--cluster-enabled", "yes", "--cluster-port", String(bus), "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout", "1000",
                    ]))
            }
            let cluster = RedisClusterServer(nodes: nodes)
            try cluster.create(replicas: replicas)
            try await cluster.waitUntilServing()
            return cluster
        } catch {
            for node in nodes { node.stop() }
            throw error
        }
    }

    /// One cluster of three masters for the whole test process (tests keep apart with key prefixes of their
    /// own, whose slots spread over the masters), stopped when the process exits.
    public static func shared() async throws -> RedisClusterServer {
        try await SharedCluster.instance.get()
    }

    private init(nodes: [RedisServer]) {
        self.nodes = nodes
    }

    private func create(replicas: Int) throws {
        let candidates = ["/usr/bin/redis-cli", "/usr/local/bin/redis-cli"]
        guard let cli = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw RedisServer.StartError(
                description: "redis-cli not found (scripts/install-test-deps installs redis-tools)")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        process.arguments =
            ["--signal=KILL", "60", cli, "--cluster", "create"] + nodes.map { "127.0.0.1:\($0.port)" }
            + ["--cluster-replicas", String(replicas), "--cluster-yes"]
        let output = Pipe()
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw RedisServer.StartError(description: "redis-cli --cluster create failed: \(text.suffix(2000))")
        }
    }

    /// Every node says `cluster_state:ok` and maps all 16,384 slots.
    private func waitUntilServing() async throws {
        let deadline = NIODeadline.now() + .seconds(30)
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        var waiting = nodes
        while !waiting.isEmpty, NIODeadline.now() < deadline {
            let node = waiting[0]
            let replies = try? await RedisClient.request(
                [RESPCommand("CLUSTER", "INFO")], configuration: RedisConfiguration(),
                to: RedisEndpoint(host: "127.0.0.1", port: node.port),
                on: loop
            ).get()
            if let info = replies?.first?.string, info.contains("cluster_state:ok"),
                info.contains("cluster_slots_assigned:16384")
            {
                waiting.removeFirst()
            } else {
                try await Task.sleep(nanoseconds: 50_000_000)
            }
        }
        guard waiting.isEmpty else {
            throw RedisServer.StartError(description: "the Redis Cluster did not become ready")
        }
    }

    public func stop() {
        for node in nodes { node.stop() }
    }
}

/// The process-wide cluster of `RedisClusterServer.shared()`.
private enum SharedCluster {
    static let instance = Once()

    // @unchecked: `task` and `started` are guarded by `lock`.
    final class Once: @unchecked Sendable {
        private let lock = NSLock()
        private var task: Task<RedisClusterServer, any Error>?
        private var started: RedisClusterServer?

        func get() async throws -> RedisClusterServer {
            let task = lock.withLock { () -> Task<RedisClusterServer, any Error> in
                if let task = self.task { return task }
                let task = Task { try await RedisClusterServer.start(masters: 3) }
                self.task = task
                atexit { SharedCluster.instance.stop() }
                return task
            }
            let cluster = try await task.value
            lock.withLock { started = cluster }
            return cluster
        }

        func stop() {
            lock.withLock { started }?.stop()
        }
    }
}
