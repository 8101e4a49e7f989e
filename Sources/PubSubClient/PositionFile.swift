import Bayeux

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A file holding the last position of each subscription, so that a subscriber started again resumes where the
/// last run stopped (`pubsub subscribe --position-file`):
///
///     {"version":1,"positions":{"/jobs/*":"2.2x8fq1kd.1u3k8jd0w7ne1"}}
///
/// It is replaced whole, never edited in place (`DurableFile`): a reader, or a run killed halfway, sees the old
/// content or the new one, never a mix; a durable write also survives a power cut.
public struct PositionFile: Sendable {
    public struct Error: Swift.Error, Sendable, Hashable, CustomStringConvertible {
        /// One line for people, naming the file.
        public var message: String
        public var description: String { message }
    }

    public let path: String

    public init(path: String) {
        self.path = path
    }

    /// The positions the file holds, or nil when there is no file (a first run). Anything else than a file
    /// written by `write` is an error, never read as "no positions": a subscriber must not silently start over.
    public func read() throws(Error) -> SubscriptionPositions? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw fail("cannot open", errno: errno)
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = chunk.withUnsafeMutableBytes { systemRead(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { throw fail("cannot read", errno: errno) }
            if n == 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
            if bytes.count > 1 << 24 { throw corrupt("larger than 16 MiB") }
        }
        return try Self.decode(bytes, path: path)
    }

    static func decode(_ bytes: [UInt8], path: String) throws(Error) -> SubscriptionPositions {
        func corrupt(_ why: String) -> Error {
            Error(message: "the position file \(path) is corrupt (\(why)); remove it to start from now")
        }
        let value: JSONValue
        do {
            value = try JSONParser().parse(bytes)
        } catch {
            throw corrupt(bytes.isEmpty ? "empty" : "not JSON: \(error)")
        }
        guard let object = value.objectValue, let version = object["version"]?.integerValue else {
            throw corrupt("no version")
        }
        guard version == 1 else { throw corrupt("version \(version), this pubsub reads version 1") }
        guard let positions = object["positions"]?.objectValue else { throw corrupt("no positions object") }
        var result = SubscriptionPositions()
        for (channel, position) in positions.entries {
            guard let text = position.stringValue, !text.isEmpty else {
                throw corrupt("the position of \(channel) is not a string")
            }
            result[channel: channel] = text
        }
        return result
    }

    static func encode(_ positions: SubscriptionPositions) -> String {
        var entries = JSONObject()
        for channel in positions.byChannel.keys.sorted() { entries[channel] = .string(positions.byChannel[channel]!) }
        let file: JSONObject = ["version": 1, "positions": .object(entries)]
        return file.jsonString + "\n"
    }

    /// Replaces the file with `positions` (`DurableFile.replace`): written to `<path>.tmp`, renamed over `path`.
    /// `durable` also calls fsync on the new file before the rename and on the folder after it.
    public func write(_ positions: SubscriptionPositions, durable: Bool) throws(Error) {
        do {
            try DurableFile.replace(path, with: Array(Self.encode(positions).utf8), durable: durable)
        } catch let error as DurableFile.Error {
            let temporary = DurableFile.temporaryPath(of: path)
            switch error.operation {
            case .create: throw fail("cannot create \(temporary) for", errno: error.code)
            case .write, .close: throw fail("cannot write", errno: error.code)
            case .sync: throw fail("cannot flush", errno: error.code)
            case .rename: throw fail("cannot rename \(temporary) to", errno: error.code)
            case .openDirectory: throw fail("cannot open the folder of", errno: error.code)
            case .syncDirectory: throw fail("cannot flush the folder of", errno: error.code)
            }
        } catch {
            throw Error(message: "cannot write the position file \(path): \(error)")  // no hook: not reached
        }
    }

    private func corrupt(_ why: String) -> Error {
        Error(message: "the position file \(path) is corrupt (\(why)); remove it to start from now")
    }

    private func fail(_ what: String, errno code: Int32) -> Error {
        Error(message: "\(what) the position file \(path): \(String(cString: strerror(code)))")
    }
}

// `read` of the C library, under a name the method above does not shadow.
private func systemRead(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
    read(fd, buffer, count)
}
