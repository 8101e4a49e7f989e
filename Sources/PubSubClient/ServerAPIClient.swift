import Bayeux
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// A client of a broker's server API (`/api/<call>`), for the CLI: one connection per call.
public struct ServerAPIClient: Sendable {
    public let url: BayeuxURL
    let key: String
    let tls: NIOSSLContext?
    let timeout: TimeAmount

    /// `url` is the broker's Bayeux endpoint (`http://host:9292/faye`); the API lives at the same origin.
    public init(url: String, key: String, trustRoots: String? = nil, timeout: TimeAmount = .seconds(10))
        throws(BayeuxClientError)
    {
        self.url = try BayeuxURL(url)
        self.key = key
        self.timeout = timeout
        if self.url.secure {
            var configuration = TLSConfiguration.makeClientConfiguration()
            if let trustRoots { configuration.trustRoots = .file(trustRoots) }
            do {
                tls = try NIOSSLContext(configuration: configuration)
            } catch {
                throw BayeuxClientError(.invalidURL, "cannot set up TLS: \(error)")
            }
        } else {
            tls = nil
        }
    }

    /// `GET /api/<call>?<query>`; the answer's JSON, or `.httpStatus` with the server's `error`.
    public func get(_ call: String, query: [(String, String)] = []) async throws -> JSONValue {
        var uri = "/api/" + call
        if !query.isEmpty {
            uri += "?" + query.map { "\(Self.escape($0.0))=\(Self.escape($0.1))" }.joined(separator: "&")
        }
        return try await send(.GET, uri: uri, body: nil)
    }

    /// `POST /api/<call>` with a JSON body.
    public func post(_ call: String, body: JSONValue) async throws -> JSONValue {
        var buffer = ByteBuffer()
        buffer.writeJSON(body)
        return try await send(.POST, uri: "/api/" + call, body: buffer)
    }

    private func send(_ method: HTTPMethod, uri: String, body: ByteBuffer?) async throws -> JSONValue {
        let group = MultiThreadedEventLoopGroup.singleton
        let connection = try await HTTPConnection.open(url, group: group, connectTimeout: timeout, tls: tls)
        defer { connection.close() }
        var headers = HTTPHeaders()
        headers.add(name: "Authorization", value: "apikey " + key)
        let response = try await connection.request(method, uri: uri, headers: headers, body: body, timeout: timeout)
            .get()
        let parsed = try? JSONParser().parse(response.body)
        guard response.status == 200, let parsed else {
            let message = parsed?.objectValue?["error"]?.stringValue ?? "HTTP \(response.status)"
            throw BayeuxClientError(.httpStatus, "\(response.status): \(message)")
        }
        return parsed
    }

    static func escape(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."),
                UInt8(ascii: "/"), UInt8(ascii: "*"):
                out.append(Character(UnicodeScalar(byte)))
            default:
                out +=
                    "%" + String(byte >> 4, radix: 16, uppercase: true) + String(byte & 15, radix: 16, uppercase: true)
            }
        }
        return out
    }
}
