import Foundation
import NIOCore
import NIOPosix
import PubSubRedis

/// A real `redis-server` on a free loopback port, for one test. Not finding or not starting it is a failure
/// (thrown), never a skip: CI installs it (scripts/install-test-deps).
// @unchecked: immutable after start: a port, a process and a directory.
public final class RedisServer: @unchecked Sendable {
    public let port: Int
    private let process: Process
    private let directory: URL

    public struct StartError: Error, CustomStringConvertible {
        public var description: String
    }

    public static func start(arguments extra: [String] = []) async throws -> RedisServer {
        if extra.isEmpty, let text = ProcessInfo.processInfo.environment["PUBSUB_TEST_REDIS_PORT"], let port = Int(text)
        {
            // A server the developer runs (e.g. to watch it with MONITOR); emptied first, never stopped.
            let server = RedisServer(existing: port)
            let client = RedisClient(
                configuration: RedisConfiguration(port: port), eventLoop: MultiThreadedEventLoopGroup.singleton.next())
            client.start()
            for _ in 0..<100 where !client.isConnected { try await Task.sleep(nanoseconds: 10_000_000) }
            _ = try await client.send(RESPCommand("FLUSHALL")).get()
            try await client.close().get()
            return server
        }
        let candidates = ["/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"]
        guard let binary = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw StartError(
                description: "redis-server not found (apt-get install redis-server; scripts/install-test-deps does)")
        }
        var lastError = ""
        for _ in 0..<3 {
            let port = try freePort()
            let server = try RedisServer(binary: binary, port: port, extra: extra)
            if await server.waitUntilReady(
                within: .seconds(10), password: extra.firstIndex(of: "--requirepass").map { extra[$0 + 1] })
            {
                return server
            }
            lastError = server.log
            server.stop()
        }
        throw StartError(description: "redis-server did not start: \(lastError)")
    }

    private init(existing port: Int) {
        self.port = port
        process = Process()
        directory = FileManager.default.temporaryDirectory
    }

    private init(binary: String, port: Int, extra: [String]) throws {
        self.port = port
        directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "pubsub-redis-\(port)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        process = Process()
        // Bounded life: should this test process crash, the server does not outlive it by more than that.
        process.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        process.arguments =
            [
                "--signal=KILL", "900", binary,
                "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--dir", directory.path, "--logfile", directory.appendingPathComponent("log").path,
            ] + extra
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
    }

    public var log: String { (try? String(contentsOf: directory.appendingPathComponent("log"), encoding: .utf8)) ?? "" }

    public var url: String { "redis://127.0.0.1:\(port)/0" }

    private func waitUntilReady(within timeout: TimeAmount, password: String?) async -> Bool {
        let deadline = NIODeadline.now() + timeout
        let group = MultiThreadedEventLoopGroup.singleton
        while NIODeadline.now() < deadline, process.isRunning {
            let client = RedisClient(
                configuration: RedisConfiguration(port: port, password: password, connectTimeout: .milliseconds(200)),
                eventLoop: group.next())
            client.start()
            for _ in 0..<20 where !client.isConnected { try? await Task.sleep(nanoseconds: 10_000_000) }
            let pong = try? await client.send(RESPCommand("PING")).get()
            try? await client.close().get()
            if pong?.string == "PONG" { return true }
            try? await Task.sleep(nanoseconds: 50_000_000)
        }
        return false
    }

    /// SIGKILL (a SIGTERM may be ignored: the test process can pass an ignored SIGTERM on to its children), then
    /// a bounded wait.
    public func stop() {
        guard process.executableURL != nil else { return }
        killUnderTimeout(process)
        try? FileManager.default.removeItem(at: directory)
    }

    public static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw StartError(description: "socket() failed") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else { throw StartError(description: "bind() failed") }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}

/// A Redis Sentinel watching `master` as `mymaster` (quorum 1), on a free loopback port, for one test: the same
/// binary as redis-server, started with `--sentinel`. Not starting is a failure, never a skip.
// @unchecked: immutable after start: a port, a process and a directory.
public final class RedisSentinelServer: @unchecked Sendable {
    public let port: Int
    public let masterName = "mymaster"
    private let process: Process
    private let directory: URL

    public static func start(watching master: RedisServer) async throws -> RedisSentinelServer {
        let candidates = ["/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"]
        guard let binary = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw RedisServer.StartError(description: "redis-server not found (scripts/install-test-deps installs it)")
        }
        let sentinel = try RedisSentinelServer(
            binary: binary, port: try RedisServer.freePort(), masterPort: master.port)
        let deadline = NIODeadline.now() + .seconds(10)
        while NIODeadline.now() < deadline, sentinel.process.isRunning {
            let client = RedisClient(
                configuration: RedisConfiguration(port: sentinel.port, connectTimeout: .milliseconds(200)),
                eventLoop: MultiThreadedEventLoopGroup.singleton.next())
            client.start()
            for _ in 0..<20 where !client.isConnected { try? await Task.sleep(nanoseconds: 10_000_000) }
            let reply = try? await client.send(RESPCommand("SENTINEL", "get-master-addr-by-name", "mymaster")).get()
            try? await client.close().get()
            if reply?.array?.count == 2 { return sentinel }
            try? await Task.sleep(nanoseconds: 50_000_000)
        }
        let log = (try? String(contentsOf: sentinel.directory.appendingPathComponent("log"), encoding: .utf8)) ?? ""
        sentinel.stop()
        throw RedisServer.StartError(description: "redis-sentinel did not start: \(log)")
    }

    private init(binary: String, port: Int, masterPort: Int) throws {
        self.port = port
        directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "pubsub-sentinel-\(port)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let config = directory.appendingPathComponent("sentinel.conf")
        try """
        port \(port)
        bind 127.0.0.1
        daemonize no
        dir \(directory.path)
        logfile \(directory.appendingPathComponent("log").path)
        sentinel monitor mymaster 127.0.0.1 \(masterPort) 1
        sentinel down-after-milliseconds mymaster 1000
        sentinel failover-timeout mymaster 5000

        """.write(to: config, atomically: true, encoding: .utf8)
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        process.arguments = ["--signal=KILL", "900", binary, config.path, "--sentinel"]
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
    }

    public var endpoint: RedisEndpoint { RedisEndpoint(host: "127.0.0.1", port: port) }

    public func stop() {
        killUnderTimeout(process)
        try? FileManager.default.removeItem(at: directory)
    }
}

/// SIGKILL to a server started under `timeout` and to `timeout` itself (the server is its child: killed first),
/// then a bounded wait (5 s) for `timeout` to end.
private func killUnderTimeout(_ process: Process) {
    guard process.isRunning else { return }
    let pid = process.processIdentifier
    if let children = try? String(contentsOfFile: "/proc/\(pid)/task/\(pid)/children", encoding: .utf8) {
        for child in children.split(separator: " ").compactMap({ Int32($0) }) { kill(child, SIGKILL) }
    }
    kill(pid, SIGKILL)
    for _ in 0..<500 where process.isRunning { usleep(10_000) }
}
