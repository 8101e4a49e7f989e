#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// CPU time and resident memory of a process on this machine, read from `/proc` (Linux only; elsewhere the
/// samples are nil and the report leaves those columns out).
struct ProcessSample: Sendable {
    /// User plus system CPU seconds since the process started.
    var cpuSeconds: Double
    /// Resident set size in bytes.
    var rssBytes: Int
    /// When the sample was taken (monotonic nanoseconds).
    var at: UInt64
}

enum ProcessSampler {
    /// Samples `pid`, or this process when nil.
    static func sample(_ pid: Int32?) -> ProcessSample? {
        let dir = pid.map { "/proc/\($0)" } ?? "/proc/self"
        guard let stat = readFile("\(dir)/stat"), let status = readFile("\(dir)/status") else { return nil }
        // The command name (field 2) is in parentheses and may hold spaces: fields are counted after the last ')'.
        guard let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // After ')' the first field is field 3 (state); utime is field 14, stime field 15.
        guard fields.count > 13, let utime = Double(fields[11]), let stime = Double(fields[12]) else { return nil }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        var rss = 0
        for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            let parts = line.split(separator: " ", omittingEmptySubsequences: true)
            if parts.count >= 2, let kb = Int(parts[1]) { rss = kb * 1024 }
        }
        return ProcessSample(cpuSeconds: (utime + stime) / ticks, rssBytes: rss, at: monotonicNanoseconds())
    }

    static func exists(_ pid: Int32) -> Bool {
        readFile("/proc/\(pid)/stat") != nil
    }

    private static func readFile(_ path: String) -> String? {
        guard let file = fopen(path, "r") else { return nil }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = fread(&chunk, 1, chunk.count, file)
            if n <= 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
