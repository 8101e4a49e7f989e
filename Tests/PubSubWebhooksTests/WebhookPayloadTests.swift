import Crypto
import NIOCore
import PubSubCore
import Testing

@testable import PubSubWebhooks

@Suite struct WebhookPayloadTests {
    @Test func eventsEncodeAsTheIssueShowsThem() {
        let subscribe = WebhookPayload.encode(
            SessionEvent(kind: .subscribe, clientId: "abc", channel: "/chat/\"room\""), at: "2026-11-25T10:00:00.000Z")
        #expect(
            String(buffer: subscribe)
                == #"{"type":"subscribe","clientId":"abc","channel":"/chat/\"room\"","user":null,"at":"2026-11-25T10:00:00.000Z"}"#
        )
        let end = WebhookPayload.encode(
            SessionEvent(kind: .disconnect, clientId: "abc", user: "42", reason: .expired), at: "T")
        #expect(
            String(buffer: end) == #"{"type":"disconnect","clientId":"abc","user":"42","reason":"expired","at":"T"}"#)
        let body = WebhookPayload.body([subscribe, end])
        #expect(String(buffer: body).hasPrefix(#"{"events":[{"type":"subscribe""#))
        #expect(String(buffer: body).hasSuffix(#""at":"T"}]}"#))
        #expect(String(buffer: WebhookPayload.body([])) == #"{"events":[]}"#)
    }

    @Test func signatureIsTheHexHMACOfTheBody() {
        let body = Array(#"{"events":[]}"#.utf8)
        let signature = WebhookSignature.sign(body, secret: "s3cret")
        let expected = HMAC<SHA256>.authenticationCode(for: body, using: SymmetricKey(data: Array("s3cret".utf8)))
        #expect(signature == "sha256=" + expected.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined())
        #expect(WebhookSignature.verify(signature, body: body, secret: "s3cret"))
        #expect(!WebhookSignature.verify(signature, body: body, secret: "other"))
        #expect(!WebhookSignature.verify(signature, body: body + [0x20], secret: "s3cret"))
        #expect(!WebhookSignature.verify("sha256=zz", body: body, secret: "s3cret"))
    }

    @Test func onlyHTTPURLsWithAHostAreAccepted() {
        #expect(WebhookConfiguration.problem(with: "http://127.0.0.1:8080/hook") == nil)
        #expect(WebhookConfiguration.problem(with: "https://user:pw@example.com/x?y=1") == nil)
        #expect(WebhookConfiguration.problem(with: "ftp://example.com") != nil)
        #expect(WebhookConfiguration.problem(with: "example.com/hook") != nil)
        #expect(WebhookConfiguration.problem(with: "http:///nohost") != nil)
    }

    @Test func endReasonsMapFromDetachReasons() {
        #expect(SessionEvent.EndReason(.expired) == .expired)
        #expect(SessionEvent.EndReason(.overflow) == .overflow)
        #expect(SessionEvent.EndReason(.kicked) == .kicked)
        #expect(SessionEvent.EndReason(.disconnected) == .client)
        #expect(SessionEvent.EndReason(.superseded) == nil)
        #expect(SessionEvent.EndReason(.shutdown) == nil)
    }
}
