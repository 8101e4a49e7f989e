import PubSubRelay
import Testing

/// Expects `body` to throw a `RelayError` of `code`, and returns it.
@discardableResult
func expectRelayError<R>(
    _ code: RelayError.Code, _ comment: Comment? = nil, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> R
) -> RelayError? {
    checkRelayError(code, comment, sourceLocation, Result { try body() })
}

/// Expects `body` to throw a `RelayError` of `code`, and returns it.
@discardableResult
func expectRelayError<R>(
    _ code: RelayError.Code, _ comment: Comment? = nil, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> R
) async -> RelayError? {
    let outcome: Result<R, any Error>
    do { outcome = .success(try await body()) } catch { outcome = .failure(error) }
    return checkRelayError(code, comment, sourceLocation, outcome)
}

private func checkRelayError<R>(
    _ code: RelayError.Code, _ comment: Comment?, _ sourceLocation: SourceLocation, _ outcome: Result<R, any Error>
) -> RelayError? {
    switch outcome {
    case .success:
        Issue.record("expected a RelayError \(code); nothing was thrown", sourceLocation: sourceLocation)
    case .failure(let error as RelayError):
        #expect(error.code == code, comment, sourceLocation: sourceLocation)
        return error
    case .failure(let error):
        Issue.record("expected a RelayError \(code), got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}

@Suite struct RelayErrorTests {
    @Test func theMessageIsWhatIsPrintedAndABLIPErrorSaysItIsOne() {
        #expect("\(RelayError(.configuration, "feeds[0].slot: required"))" == "feeds[0].slot: required")
        #expect("\(RelayError(.blipProtocol, "bad frame"))" == "BLIP: bad frame")
        #expect(RelayError(.blipProtocol, "bad frame").message == "bad frame")
    }

    @Test func onlyASourceFatalErrorEndsTheRelay() {
        #expect(RelayError(.sourceFatal, "authentication refused").isFatal)
        let others: [RelayError.Code] = [
            .configuration, .invalidURL, .checkpoint, .publish, .source, .feed, .blipProtocol, .simperiumProtocol,
            .malformedWal2JSON,
        ]
        #expect(others.allSatisfy { !RelayError($0, "x").isFatal })
        #expect(Set(others.map(\.description)).count == others.count)
    }

    /// The relay's last line ("relay stopped: …") is said by the source that ran: a certificate refused by any
    /// feed says what to do about it, a PostgreSQL error gives the server's message.
    @Test func eachSourceSaysWhyTheRelayStopped() {
        struct Refused: Error, CustomStringConvertible {
            var description: String { "handshakeFailed(CERTIFICATE_VERIFY_FAILED)" }
        }
        struct Source: ChangeSource {
            var sourceID: String { "test" }
            func start(after position: String?) async throws {}
            func next() async throws -> ChangeBatch? { nil }
            func confirm(_ position: String) async throws {}
            func lag() async -> SourceLag? { nil }
            func close() async {}
        }
        #expect(Source().describe(Refused()).contains("--feed-ca-file"))
        #expect(Source().describe(RelayError(.publish, "503 from the broker")) == "503 from the broker")
        #expect(PostgresChangeSource.describe(Refused()).contains("--feed-ca-file"))
    }
}
