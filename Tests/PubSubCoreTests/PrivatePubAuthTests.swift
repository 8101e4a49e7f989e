import Bayeux
import PubSubTesting
import Testing

@testable import PubSubCore

@Suite struct PrivatePubAuthTests {
    static let nowMs: Int64 = 1_700_000_000_000

    @Test func signatureVectors() {
        #expect(
            PrivatePubAuth.signature(secret: "token", channel: "channel", timestamp: "123")
                == "3cfb97087e7c99545a9e5d62393ce90e888e48fb")
        #expect(
            PrivatePubAuth.signature(secret: "secret", channel: "/messages/new", timestamp: "1700000000000")
                == "e6541e9adc999c15f7cbae4fa5dd05e07390551a")
    }

    func harness(expiration: Double? = 3600) -> Harness {
        Harness(
            configuration: BrokerConfiguration(historySize: 0),
            extensions: [PrivatePubAuth(secret: "secret", signatureExpiration: expiration, now: { Self.nowMs })])
    }

    func subscribe(_ h: Harness, _ cid: String, channel: String, ts: String, signature: String? = nil) -> JSONObject {
        let sig = signature ?? PrivatePubAuth.signature(secret: "secret", channel: channel, timestamp: ts)
        return h.reply(
            #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"\#(channel)","ext":{"private_pub_signature":"\#(sig)","private_pub_timestamp":\#(ts)}}"#
        )
    }

    @Test func subscriptionChecks() {
        let h = harness()
        let cid = h.handshake()
        #expect(subscribe(h, cid, channel: "/messages/new", ts: "1700000000000")["successful"] == true)
        #expect(
            subscribe(
                h, cid, channel: "/messages/new", ts: "\"1700000000000\"",
                signature: PrivatePubAuth.signature(
                    secret: "secret", channel: "/messages/new", timestamp: "1700000000000"))["successful"] == true)
        #expect(
            subscribe(h, cid, channel: "/messages/new", ts: "1700000000000", signature: "0000")["error"]
                == "Incorrect signature.")
        let other = PrivatePubAuth.signature(secret: "secret", channel: "/other", timestamp: "1700000000000")
        #expect(
            subscribe(h, cid, channel: "/messages/new", ts: "1700000000000", signature: other)["error"]
                == "Incorrect signature.")
        #expect(
            subscribe(h, cid, channel: "/messages/new", ts: "\(Self.nowMs - 7_200_000)")["error"]
                == "Signature has expired.")
        #expect(
            subscribe(h, cid, channel: "/messages/new", ts: "\(Self.nowMs + 3_600_000)")["error"]
                == "Signature timestamp is in the future.")
        let noExt = h.reply(#"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"/messages/new"}"#)
        #expect(noExt["error"] == "Incorrect signature.")
        #expect(noExt["successful"] == false)
        // A wildcard needs a signature made for that exact pattern.
        let channelSig = PrivatePubAuth.signature(
            secret: "secret", channel: "/messages/new", timestamp: "1700000000000")
        #expect(
            subscribe(h, cid, channel: "/messages/*", ts: "1700000000000", signature: channelSig)["error"]
                == "Incorrect signature.")
        #expect(subscribe(h, cid, channel: "/messages/*", ts: "1700000000000")["successful"] == true)
    }

    @Test func withoutExpirationOldSignaturesStayValid() {
        let h = harness(expiration: nil)
        let cid = h.handshake()
        #expect(subscribe(h, cid, channel: "/a", ts: "123")["successful"] == true)
    }

    @Test func publishNeedsTheTokenWhichIsBlankedBeforeDelivery() {
        let h = harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        _ = subscribe(h, cid, channel: "/messages/new", ts: "1700000000000")
        #expect(h.reply(#"{"channel":"/messages/new","data":1}"#)["error"] == "Incorrect token.")
        #expect(
            h.reply(#"{"channel":"/messages/new","data":1,"ext":{"private_pub_token":"wrong"}}"#)["error"]
                == "Incorrect token.")
        #expect(h.reply(#"{"channel":"/service/foo","data":1}"#)["error"] == "Incorrect token.")
        let ok = h.reply(
            #"{"channel":"/messages/new","data":{"channel":"/messages/new","eval":"alert(1)"},"ext":{"private_pub_token":"secret"}}"#
        )
        #expect(ok == json(#"{"channel":"/messages/new","successful":true}"#).objectValue)
        guard case .connect(let c) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.events.count == 1)
        let event = try! JSONParser().parse(c.result.events.first!.json).arrayValue![0]
        #expect(
            event
                == json(
                    #"{"channel":"/messages/new","data":{"channel":"/messages/new","eval":"alert(1)"},"ext":{"private_pub_token":null}}"#
                ))
    }

    @Test func unsubscribeConnectAndDisconnectNeedNothing() {
        let h = harness()
        let cid = h.handshake()
        if case .connect = h.connect(cid) {} else { Issue.record("connect refused") }
        #expect(
            h.reply(#"{"channel":"/meta/unsubscribe","clientId":"\#(cid)","subscription":"/a"}"#)["successful"] == true)
        #expect(h.reply(#"{"channel":"/meta/disconnect","clientId":"\#(cid)"}"#)["successful"] == true)
    }

    @Test func constantTimeComparison() {
        #expect(constantTimeEqual("abc", "abc"))
        #expect(!constantTimeEqual("abc", "abd"))
        #expect(!constantTimeEqual("abc", "abcd"))
        #expect(!constantTimeEqual("", "a"))
    }
}
