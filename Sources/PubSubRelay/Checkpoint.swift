import Bayeux

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The relay's own record of how far a source has been relayed.
public struct Checkpoint: Sendable, Equatable {
    public var sourceID: String
    public var position: String

    public init(sourceID: String, position: String) {
        self.sourceID = sourceID
        self.position = position
    }
}

/// Where checkpoints are kept. `save` returns only once the checkpoint survives a crash of the process or the
/// machine.
public protocol CheckpointStore: Sendable {
    func load() throws -> Checkpoint?
    func save(_ checkpoint: Checkpoint) throws
}

/// A checkpoint in one small JSON file, replaced atomically and durably (`DurableFile`): write `<path>.tmp`, fsync
/// it, rename it over `<path>`, fsync the directory. A crash at any instant leaves either the old or the new one.
public struct FileCheckpointStore: CheckpointStore {
    /// The steps of `save`, in order, for tests that inject a failure before one of them.
    public typealias Step = DurableFile.Step

    public var path: String
    /// Called before each step; a throw aborts `save` there (tests only).
    public var beforeStep: (@Sendable (Step) throws -> Void)?

    public init(path: String, beforeStep: (@Sendable (Step) throws -> Void)? = nil) {
        self.path = path
        self.beforeStep = beforeStep
    }

    public func load() throws -> Checkpoint? {
        let fd = open(path, O_RDONLY)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw RelayError(.checkpoint, "cannot read checkpoint \(path): \(Self.errorText())")
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw RelayError(.checkpoint, "cannot read checkpoint \(path): \(Self.errorText())")
            }
            if n == 0 { break }
            bytes += chunk[0..<n]
            if bytes.count > 1 << 20 { throw RelayError(.checkpoint, "checkpoint \(path) is too large") }
        }
        guard let value = try? JSONParser().parse(bytes), let object = value.objectValue,
            let source = object["source"]?.stringValue, let position = object["position"]?.stringValue
        else {
            throw RelayError(
                .checkpoint, "checkpoint \(path) is not a relay checkpoint (expected {\"source\", \"position\"})")
        }
        return Checkpoint(sourceID: source, position: position)
    }

    public func save(_ checkpoint: Checkpoint) throws {
        let object: JSONObject = ["source": .string(checkpoint.sourceID), "position": .string(checkpoint.position)]
        do {
            try DurableFile.replace(
                path, with: Array((object.jsonString + "\n").utf8), durable: true,
                beforeStep: beforeStep)
        } catch let error as DurableFile.Error {
            let reason = error.reason
            switch error.operation {
            case .create, .write: throw RelayError(.checkpoint, "cannot write checkpoint \(error.path): \(reason)")
            case .sync: throw RelayError(.checkpoint, "cannot sync checkpoint \(error.path): \(reason)")
            case .close: throw RelayError(.checkpoint, "cannot close checkpoint \(error.path): \(reason)")
            case .rename: throw RelayError(.checkpoint, "cannot replace checkpoint \(error.path): \(reason)")
            case .openDirectory: throw RelayError(.checkpoint, "cannot open directory \(error.path): \(reason)")
            case .syncDirectory: throw RelayError(.checkpoint, "cannot sync directory \(error.path): \(reason)")
            }
        }
    }

    static func errorText() -> String { String(cString: strerror(errno)) }
}
