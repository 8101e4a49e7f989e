import AsyncHTTPClient
import NIOCore
import NIOHTTP1

extension JWKSKeySource {
    /// A GET of the JWKS URL with async-http-client, bounded in time (the deadline covers connecting, the
    /// answer's head and its body) and in size (a larger body, announced or streamed, ends the request).
    static func httpFetcher(settings: JWKSSettings, client: HTTPClient = .shared) -> Fetcher {
        { () async throws -> ByteBuffer in
            let request: HTTPClient.Request
            do {
                var headers = HTTPHeaders()
                headers.add(name: "Accept", value: "application/jwk-set+json, application/json")
                request = try HTTPClient.Request(url: settings.url, method: .GET, headers: headers)
            } catch {
                throw JWKSFailure(.unreachable, "\(error)")
            }
            let task = client.execute(
                request: request, delegate: ResponseAccumulator(request: request, maxBodySize: settings.maxBytes),
                eventLoop: .indifferent, deadline: .now() + settings.timeout)
            let response: HTTPClient.Response
            do {
                response = try await withTaskCancellationHandler {
                    try await task.futureResult.get()
                } onCancel: {
                    task.cancel()
                }
            } catch is ResponseAccumulator.ResponseTooBigError {
                throw JWKSFailure(.tooLarge, "the answer is over \(settings.maxBytes) bytes")
            } catch let error as HTTPClientError
                where error == .deadlineExceeded || error == .readTimeout || error == .connectTimeout
            {
                throw JWKSFailure(.timeout, "no whole answer within \(settings.timeout.nanoseconds / 1_000_000) ms")
            } catch {
                throw JWKSFailure(.unreachable, "\(error)")
            }
            guard response.status == .ok else {
                throw JWKSFailure(.status, "HTTP \(response.status.code)")
            }
            return response.body ?? ByteBuffer()
        }
    }
}
