import NIOCore
import Testing

@testable import PubSubWebhooks

@Suite struct WebhookEndpointTests {
    let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)

    @Test func aWaitingSenderWakesForWhatItWaitsFor() {
        var state = WebhookDispatcher.Endpoint.State(
            queue: WebhookQueue(settings: WebhookQueueSettings(capacity: 10, maxBatch: 2)))
        #expect(!state.shouldWake(.onEvents, sawFlushing: false))
        _ = state.queue.append(ByteBuffer(string: "a"), now: t0)
        // Idle: any event wakes it. Waiting for a batch's delay: only a full batch does.
        #expect(state.shouldWake(.onEvents, sawFlushing: false))
        #expect(!state.shouldWake(.onFullBatch, sawFlushing: false))
        _ = state.queue.append(ByteBuffer(string: "b"), now: t0)
        #expect(state.shouldWake(.onFullBatch, sawFlushing: false))
        // While a batch is in flight (or waits for its retry), newer events never cut the wait short.
        guard case .send = state.queue.next(now: t0) else {
            Issue.record("no send")
            return
        }
        _ = state.queue.failed(now: t0)
        for text in ["c", "d"] { _ = state.queue.append(ByteBuffer(string: text), now: t0) }
        #expect(!state.shouldWake(.onFullBatch, sawFlushing: false))
        // A drain that began since the wait started always wakes it, once.
        state.queue.flush()
        #expect(state.shouldWake(.onFullBatch, sawFlushing: false))
        #expect(!state.shouldWake(.onFullBatch, sawFlushing: true))
    }

    @Test func userInfoBecomesBasicAuthAndLeavesTheURLAndTheLabel() {
        let endpoint = WebhookDispatcher.Endpoint(
            url: "https://hooks:pa:ss@example.com:8443/in?x=1", settings: WebhookQueueSettings())
        #expect(endpoint.url == "https://example.com:8443/in?x=1")
        #expect(endpoint.basicAuth?.username == "hooks")
        #expect(endpoint.basicAuth?.password == "pa:ss")
        #expect(endpoint.label == "https://example.com:8443")
        let encoded = WebhookDispatcher.Endpoint(
            url: "https://h%40oks:p%40ss%3Aw0rd@[::1]:8443/in", settings: WebhookQueueSettings())
        #expect(encoded.url == "https://[::1]:8443/in")
        #expect(encoded.basicAuth?.username == "h@oks")
        #expect(encoded.basicAuth?.password == "p@ss:w0rd")
        let plain = WebhookDispatcher.Endpoint(url: "http://127.0.0.1:9/h", settings: WebhookQueueSettings())
        #expect(plain.url == "http://127.0.0.1:9/h")
        #expect(plain.basicAuth == nil)
    }
}
