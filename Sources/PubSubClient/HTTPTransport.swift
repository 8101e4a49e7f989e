import Bayeux
import NIOCore
import NIOHTTP1
import NIOSSL

/// Long-polling over HTTP/1.1 POSTs with JSON bodies. Held `/meta/connect` requests use their own connection,
/// so that publishes and subscribes are never queued behind a parked connect. Honours `429 Too Many Requests`
/// with `Retry-After`, a bounded number of times.
actor HTTPTransport: BayeuxTransport {
    nonisolated let connectionType = ConnectionType.longPolling
    let url: BayeuxURL
    let group: any EventLoopGroup
    let configuration: BayeuxClient.Configuration
    let onEvents: @Sendable ([Message]) -> Void
    let tls: NIOSSLContext?
    private var general: HTTPConnection?
    private var poll: HTTPConnection?
    private var opening: [Bool: Task<HTTPConnection, any Error>] = [:]
    private var closed = false

    init(
        url: BayeuxURL, group: any EventLoopGroup, configuration: BayeuxClient.Configuration, tls: NIOSSLContext?,
        onEvents: @escaping @Sendable ([Message]) -> Void
    ) {
        self.url = url
        self.group = group
        self.configuration = configuration
        self.tls = tls
        self.onEvents = onEvents
    }

    private func connection(forPoll: Bool) async throws -> HTTPConnection {
        if closed { throw BayeuxClientError(.notConnected, "the client is closed") }
        if let c = forPoll ? poll : general, c.isActive { return c }
        if let task = opening[forPoll] { return try await task.value }
        let (url, group, timeout, tls) = (self.url, self.group, configuration.connectTimeout, self.tls)
        let task = Task { try await HTTPConnection.open(url, group: group, connectTimeout: timeout, tls: tls) }
        opening[forPoll] = task
        defer { opening[forPoll] = nil }
        let c = try await task.value
        if forPoll { poll = c } else { general = c }
        if closed { c.close() }
        return c
    }

    func exchange(_ messages: [Message], timeout: TimeAmount) async throws -> [Message] {
        let isPoll = messages.contains { $0.channel == Channel.connect }
        var attempt = 0
        while true {
            let c = try await connection(forPoll: isPoll)
            let response = try await withTaskCancellationHandler {
                try await c.post(ReplySorter.encode(messages), timeout: timeout).get()
            } onCancel: {
                c.close()
            }
            if response.status == 429 {
                attempt += 1
                try await waitAfterRateLimit(response, attempt: attempt)
                continue
            }
            return try replies(to: messages, in: response)
        }
    }

    func exchangePipelined(_ batches: [[Message]], window: Int, timeout: TimeAmount) async throws -> [[Message]] {
        var results = [[Message]?](repeating: nil, count: batches.count)
        var queue = Array(batches.indices)
        var attempts: [Int: Int] = [:]
        var window = max(1, window)
        while !queue.isEmpty {
            let c = try await connection(forPoll: false)
            var inflight: [(index: Int, response: EventLoopFuture<HTTPResponse>)] = []
            var next = 0
            var retry: [Int] = []
            var rateLimited: HTTPResponse?
            while (next < queue.count && rateLimited == nil) || !inflight.isEmpty {
                while inflight.count < window, next < queue.count, rateLimited == nil {
                    let index = queue[next]
                    next += 1
                    inflight.append((index, c.post(ReplySorter.encode(batches[index]), timeout: timeout)))
                }
                let (index, future) = inflight.removeFirst()
                let response = try await withTaskCancellationHandler {
                    try await future.get()
                } onCancel: {
                    c.close()
                }
                if response.status == 429 {
                    retry.append(index)
                    attempts[index, default: 0] += 1
                    if rateLimited == nil { rateLimited = response }
                    continue
                }
                results[index] = try replies(to: batches[index], in: response)
            }
            queue = retry + queue[next...]
            if let rateLimited {
                // Order matters more than speed once the server pushes back: one batch at a time from here on.
                window = 1
                try await waitAfterRateLimit(rateLimited, attempt: retry.map { attempts[$0]! }.max()!)
            }
        }
        return results.map { $0! }
    }

    /// One request for all the groups; the server answers it as a whole (a connect sent with other messages is
    /// answered at once), so every group's replies are in when it returns.
    func exchange(groups: [[Message]], timeouts: [TimeAmount]) async throws -> [PendingReplies] {
        let replies = try await exchange(groups.flatMap { $0 }, timeout: timeouts.max() ?? configuration.requestTimeout)
        let loop = group.next()
        return groups.map { sent in
            let ids = Set(sent.compactMap(\.id))
            return PendingReplies(
                future: loop.makeSucceededFuture(replies.filter { $0.id.map(ids.contains) ?? false }),
                cancel: {})
        }
    }

    /// A failed long-polling request is seen by the connect that it carried.
    nonisolated func takeInterruption() -> Bool { false }

    private func waitAfterRateLimit(_ response: HTTPResponse, attempt: Int) async throws {
        guard attempt <= configuration.maxRateLimitRetries else {
            throw BayeuxClientError(
                .rateLimited,
                "rate limited by \(url.hostHeader) (HTTP 429) after \(configuration.maxRateLimitRetries) retries",
                status: 429)
        }
        let advised = response.headers.first(name: "retry-after").flatMap { Double($0.trimmingSpaces) }
        let wait = min(max(advised ?? 1, 0), configuration.maxRetryAfter)
        try await Task.sleep(nanoseconds: UInt64(wait * 1e9))
    }

    private func replies(to sent: [Message], in response: HTTPResponse) throws -> [Message] {
        guard response.status == 200 else {
            let text = ReplySorter.preview(response.body)
            throw BayeuxClientError(
                .httpStatus, "HTTP \(response.status) from \(url.hostHeader)" + (text.isEmpty ? "" : ": \(text)"),
                status: response.status)
        }
        let (replies, events) = ReplySorter.sort(try ReplySorter.parse(response.body), sent: sent)
        if !events.isEmpty { onEvents(events) }
        return replies
    }

    func close() async {
        closed = true
        general?.close()
        poll?.close()
        general = nil
        poll = nil
    }
}

extension String {
    var trimmingSpaces: String {
        var s = Substring(self)
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return String(s)
    }
}
