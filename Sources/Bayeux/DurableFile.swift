#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Replaces a small file whole, never in place: the new bytes go to `<path>.tmp`, which is renamed over `path`,
/// so a reader (or a process killed halfway) sees the old content or the new one, never a mix. A durable
/// replacement also calls fsync on the new file before the rename and on its folder after it, so the new
/// content survives a crash of the machine too. The position file of `pubsub subscribe` and the relay's
/// checkpoint are written this way.
public enum DurableFile {
    /// The steps of `replace`, in order; `beforeStep` is called before each one it takes (tests inject failures
    /// there). Without `durable`, the two sync steps are not taken.
    public enum Step: String, Sendable, CaseIterable {
        case writeTemporary
        case syncTemporary
        case rename
        case syncDirectory
    }

    /// The system call that failed, the file or folder it was given, and the errno it returned.
    public struct Error: Swift.Error, Sendable, Hashable, CustomStringConvertible {
        public enum Operation: String, Sendable, Hashable {
            /// Creating `<path>.tmp`.
            case create
            case write
            /// fsync of `<path>.tmp`.
            case sync
            case close
            /// Renaming `<path>.tmp` over the file.
            case rename
            case openDirectory
            /// fsync of the folder.
            case syncDirectory
        }

        public var operation: Operation
        /// The temporary file, the file (for `rename`) or the folder the failed call was about.
        public var path: String
        public var code: Int32

        public init(_ operation: Operation, path: String, code: Int32) {
            self.operation = operation
            self.path = path
            self.code = code
        }

        /// The system's text for `code`, such as "No such file or directory".
        public var reason: String { String(cString: strerror(code)) }
        public var description: String { "\(operation.rawValue) \(path): \(reason)" }
    }

    /// Where `replace` writes the new content before renaming it over `path`.
    public static func temporaryPath(of path: String) -> String { path + ".tmp" }

    /// The folder holding `path`: "." for a bare name, "/" for a file at the root.
    public static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// Replaces the content of `path` with `bytes` as described above. Throws `DurableFile.Error` for a failed
    /// system call, or whatever `beforeStep` throws (the replacement stops there).
    public static func replace(
        _ path: String, with bytes: [UInt8], durable: Bool, beforeStep: ((Step) throws -> Void)? = nil
    ) throws {
        let temporary = temporaryPath(of: path)
        try beforeStep?(.writeTemporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        if fd < 0 { throw Error(.create, path: temporary, code: errno) }
        var isOpen = true
        defer { if isOpen { close(fd) } }
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { systemWrite(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { throw Error(.write, path: temporary, code: errno) }
            if n == 0 { throw Error(.write, path: temporary, code: EIO) }
            offset += n
        }
        if durable {
            try beforeStep?(.syncTemporary)
            if fsync(fd) != 0 { throw Error(.sync, path: temporary, code: errno) }
        }
        isOpen = false
        if close(fd) != 0 { throw Error(.close, path: temporary, code: errno) }

        try beforeStep?(.rename)
        if rename(temporary, path) != 0 { throw Error(.rename, path: path, code: errno) }
        guard durable else { return }

        try beforeStep?(.syncDirectory)
        let folderPath = Self.directory(of: path)
        let folder = open(folderPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if folder < 0 { throw Error(.openDirectory, path: folderPath, code: errno) }
        defer { close(folder) }
        // EINVAL: the file system cannot sync a folder; there is nothing more to do.
        if fsync(folder) != 0 && errno != EINVAL { throw Error(.syncDirectory, path: folderPath, code: errno) }
    }
}

// `write` of the C library, under a name nothing here shadows.
private func systemWrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Int { write(fd, buffer, count) }
