import ArgumentParser
import PubSubClient

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Exit statuses of the client commands (publish, subscribe, sign), following sysexits(3) where one fits.
enum ExitStatus {
    /// The server refused a message (its error is printed).
    static let refused: Int32 = 1
    /// `subscribe`: events since the kept position cannot all be delivered (`recovered: false`).
    static let notRecovered: Int32 = 3
    /// Bad arguments: a wildcard or invalid channel, a bad URL, a missing secret.
    static let usage: Int32 = 64
    /// The data is not valid JSON (nothing was sent).
    static let dataError: Int32 = 65
    /// The server cannot be reached, or answered with an HTTP error.
    static let unavailable: Int32 = 69
    /// A file cannot be written (`subscribe --position-file`).
    static let ioError: Int32 = 74
    /// The connection broke, a reply did not come in time, or rate limiting outlasted the retries: the
    /// outcome is unknown, trying again later is reasonable.
    static let tempFail: Int32 = 75
    /// The server's answer was not Bayeux.
    static let protocolError: Int32 = 76
    /// The configuration file cannot be read or lacks what is needed.
    static let config: Int32 = 78
}

/// Prints `pubsub: <message>` on stderr and returns the exit code to throw.
func failure(_ message: String, _ status: Int32) -> ExitCode {
    printError("pubsub: " + message)
    return ExitCode(status)
}

/// The exit for a client library error.
func failure(_ error: BayeuxClientError, context: String? = nil) -> ExitCode {
    let prefix = context.map { "\($0): " } ?? ""
    switch error.code {
    case .refused: return failure(prefix + "refused by the server: " + error.message, ExitStatus.refused)
    case .invalidURL: return failure(error.message, ExitStatus.usage)
    case .unreachable, .httpStatus: return failure(prefix + error.message, ExitStatus.unavailable)
    case .protocolError: return failure(prefix + error.message, ExitStatus.protocolError)
    default: return failure(prefix + error.message, ExitStatus.tempFail)
    }
}

/// Writes one line to standard output at once (no buffering: a reader on a pipe sees each line as it comes).
func writeLine(_ line: String) {
    var text = line
    text.append("\n")
    text.withUTF8 { bytes in
        var offset = 0
        while offset < bytes.count {
            let n = write(1, bytes.baseAddress! + offset, bytes.count - offset)
            if n <= 0 {
                if n < 0 && errno == EINTR { continue }
                return
            }
            offset += n
        }
    }
}

/// Everything on standard input, as bytes.
func readStandardInput() -> [UInt8] {
    var data: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(0, $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { break }
        data.append(contentsOf: chunk[0..<n])
    }
    return data
}

/// A whole file, or nil with errno set.
func readFile(_ path: String) -> [UInt8]? {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var data: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        if n < 0 { return nil }
        if n == 0 { break }
        data.append(contentsOf: chunk[0..<n])
    }
    return data
}

/// Milliseconds since the epoch, as PrivatePub's timestamps.
func nowMilliseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}
