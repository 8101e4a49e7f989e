import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import Testing

@testable import PubSubAuth
@testable import PubSubCore

/// The hook's request body, answer parsing, cache key and concurrency bound (the calls themselves are tested
/// against a real hook server in Tests/auth).
@Suite struct HookAuthorizerTests {
    @Test func bodyCarriesWhatTheAppNeeds() throws {
        var message = Message()
        message.ext = ["token": "t"]
        let request = AuthorizationRequest(
            action: .subscribe, clientId: "c1", channel: "/jobs/42", message: message, user: "42",
            context: RequestContext(
                connectionType: .websocket, remoteAddress: "10.0.0.1",
                headers: ["cookie": "s=1", "origin": "https://app", "x-other": "no"]))
        let body = try JSONParser().parse(HookAuthorizer.body(request))
        #expect(
            body
                == (try JSONParser().parse(
                    #"{"action":"subscribe","clientId":"c1","channel":"/jobs/42","ext":{"token":"t"},"user":"42","transport":"websocket","remoteAddress":"10.0.0.1","headers":{"cookie":"s=1","origin":"https://app"}}"#
                )))
        var handshake = request
        handshake.action = .handshake
        handshake.clientId = nil
        handshake.channel = nil
        handshake.user = nil
        let object = try #require(try JSONParser().parse(HookAuthorizer.body(handshake)).objectValue)
        #expect(object["channel"] == nil && object["clientId"] == nil && object["user"] == .null)
    }

    @Test(arguments: [
        (#"{"allow":true}"#, HookAuthorizer.Answer(allow: true) as HookAuthorizer.Answer?),
        (#"{"allow":true,"user":"42"}"#, HookAuthorizer.Answer(allow: true, user: "42")),
        (#"{"allow":true,"user":42}"#, HookAuthorizer.Answer(allow: true, user: "42")),
        (#"{"allow":false,"error":"Not your job"}"#, HookAuthorizer.Answer(allow: false, error: "Not your job")),
        (#"{"allow":false,"error":"two\nlines"}"#, HookAuthorizer.Answer(allow: false, error: "two lines")),
        (#"{"allow":false}"#, HookAuthorizer.Answer(allow: false)),
        (#"{"allow":"yes"}"#, nil),
        (#"{}"#, nil),
        (#"[true]"#, nil),
        (#"<html>"#, nil),
        ("", nil),
    ])
    func answers(_ body: String, _ expected: HookAuthorizer.Answer?) {
        #expect(HookAuthorizer.parseAnswer(ByteBuffer(string: body)) == expected)
    }

    @Test func denialsCarryTheAppsTextInFayesForm() {
        #expect(
            HookAuthorizer.decision(.init(allow: false, error: "Not your job"), channel: "/jobs/42")
                == .deny("403:/jobs/42:Not your job"))
        #expect(HookAuthorizer.decision(.init(allow: false), channel: "/a") == .deny("403:/a:Forbidden"))
        #expect(HookAuthorizer.decision(.init(allow: true, user: "9"), channel: "") == .allow(user: "9"))
    }

    @Test func cacheKeyIgnoresTheClientButNotTheCredentials() {
        func request(_ clientId: String, cookie: String) -> AuthorizationRequest {
            AuthorizationRequest(
                action: .subscribe, clientId: clientId, channel: "/a", message: Message(), user: nil,
                context: RequestContext(connectionType: .longPolling, headers: ["cookie": cookie]))
        }
        #expect(
            HookAuthorizer.cacheKey(request("c1", cookie: "s=1"))
                == HookAuthorizer.cacheKey(request("c2", cookie: "s=1")))
        #expect(
            HookAuthorizer.cacheKey(request("c1", cookie: "s=1"))
                != HookAuthorizer.cacheKey(request("c1", cookie: "s=2")))
    }

    @Test func limiterBoundsCallsAndQueue() {
        let limiter = HookAuthorizer.Limiter(maxConcurrent: 2, maxWaiting: 1)
        let started = NIOLockedValueBox(0)
        let start: @Sendable () -> Void = { started.withLockedValue { $0 += 1 } }
        #expect(limiter.acquire(start) && limiter.acquire(start))
        #expect(started.withLockedValue { $0 } == 2)
        #expect(limiter.acquire(start))  // waits
        #expect(!limiter.acquire(start))  // queue full: refused at once
        #expect(started.withLockedValue { $0 } == 2)
        limiter.release()  // the waiter takes the slot
        #expect(started.withLockedValue { $0 } == 3)
        limiter.release()
        limiter.release()
        #expect(limiter.acquire(start) && limiter.acquire(start))
        #expect(started.withLockedValue { $0 } == 5)
    }
}
