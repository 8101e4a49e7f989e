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

/// A checkpoint in one small JSON file, replaced atomically and durably: write `<path>.tmp`, fsync it, rename it
/// over `<path>`, fsync the directory. A crash at any instant leaves either the old or the new checkpoint.
public struct FileCheckpointStore: CheckpointStore {
    /// The steps of `save`, in order, for tests that inject a failure before one of them.
    public enum Step: String, Sendable, CaseIterable {
        case writeTemporary
        case syncTemporary
        case rename
        case syncDirectory
    }

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
        let temporary = path + ".tmp"
        let object: JSONObject = ["source": .string(checkpoint.sourceID), "position": .string(checkpoint.position)]
        let bytes = Array((object.jsonString + "\n").utf8)

        try beforeStep?(.writeTemporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        if fd < 0 { throw RelayError(.checkpoint, "cannot write checkpoint \(temporary): \(Self.errorText())") }
        var closed = false
        defer { if !closed { close(fd) } }
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 {
                if errno == EINTR { continue }
                throw RelayError(.checkpoint, "cannot write checkpoint \(temporary): \(Self.errorText())")
            }
            offset += n
        }
        try beforeStep?(.syncTemporary)
        if fsync(fd) != 0 { throw RelayError(.checkpoint, "cannot sync checkpoint \(temporary): \(Self.errorText())") }
        closed = true
        if close(fd) != 0 { throw RelayError(.checkpoint, "cannot close checkpoint \(temporary): \(Self.errorText())") }

        try beforeStep?(.rename)
        if rename(temporary, path) != 0 {
            throw RelayError(.checkpoint, "cannot replace checkpoint \(path): \(Self.errorText())")
        }
        try beforeStep?(.syncDirectory)
        let directory = Self.directory(of: path)
        let dfd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dfd < 0 { throw RelayError(.checkpoint, "cannot open directory \(directory): \(Self.errorText())") }
        defer { close(dfd) }
        if fsync(dfd) != 0 { throw RelayError(.checkpoint, "cannot sync directory \(directory): \(Self.errorText())") }
    }

    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let directory = String(path[..<slash])
        return directory.isEmpty ? "/" : directory
    }

    static func errorText() -> String { String(cString: strerror(errno)) }
}
