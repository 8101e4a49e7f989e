import Bayeux
import Testing

@testable import PubSubCore

@Suite struct HMACAuthTests {
    static let nowMs: Int64 = 1_700_000_000_000
    static let ts = "1700000000000"

    func harness(_ scheme: SignatureScheme, binding: Bool = false, publicChannels: [String] = []) -> Harness {
        Harness(extensions: [
            PrivatePubAuth(
                secret: "secret", signatureExpiration: 3600, signatures: scheme, requireClientBinding: binding,
                publicChannels: publicChannels, now: { Self.nowMs })
        ])
    }

    func subscribeHMAC(
        _ h: Harness, _ cid: String, _ channel: String, ts: String = HMACAuthTests.ts,
        signature: String
    ) -> JSONObject {
        h.reply(
            #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"\#(channel)","ext":{"signature":"\#(signature)","timestamp":\#(ts)}}"#
        )
    }

    func subscribeSHA1(_ h: Harness, _ cid: String, _ channel: String) -> JSONObject {
        let sig = PrivatePubAuth.signature(secret: "secret", channel: channel, timestamp: Self.ts)
        return h.reply(
            #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"\#(channel)","ext":{"private_pub_signature":"\#(sig)","private_pub_timestamp":\#(Self.ts)}}"#
        )
    }

    @Test func signingStringAndVector() {
        #expect(
            PrivatePubAuth.hmacSigningString(channel: "/a/b", timestamp: "123", clientId: nil)
                == "subscribe\n/a/b\n123\n")
        #expect(
            PrivatePubAuth.hmacSigningString(channel: "/a/b", timestamp: "123", clientId: "abc")
                == "subscribe\n/a/b\n123\nabc")
        // Computed independently with Python: hmac.new(b"token", b"subscribe\nchannel\n123\n", sha256).hexdigest()
        #expect(
            PrivatePubAuth.hmacSignature(secret: "token", channel: "channel", timestamp: "123")
                == "4f922045b47271e4847e83007d49c583bdf701f2d080d09e6641e6dd64399775")
    }

    @Test func hmacModeAcceptsHMACAndRefusesSHA1() {
        let h = harness(.hmac)
        let cid = h.handshake()
        let unbound = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/a", timestamp: Self.ts)
        #expect(subscribeHMAC(h, cid, "/a", signature: unbound)["successful"] == true)
        let bound = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/b", timestamp: Self.ts, clientId: cid)
        #expect(subscribeHMAC(h, cid, "/b", signature: bound)["successful"] == true)
        #expect(subscribeHMAC(h, cid, "/b", ts: "\"\(Self.ts)\"", signature: bound)["successful"] == true)
        #expect(subscribeSHA1(h, cid, "/c")["error"] == "Incorrect signature.")
        // Another channel's, another client's, another secret's, wrong timestamp, upper case.
        let otherChannel = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/x", timestamp: Self.ts)
        #expect(subscribeHMAC(h, cid, "/d", signature: otherChannel)["error"] == "Incorrect signature.")
        let otherClient = PrivatePubAuth.hmacSignature(
            secret: "secret", channel: "/d", timestamp: Self.ts, clientId: "someoneelse")
        #expect(subscribeHMAC(h, cid, "/d", signature: otherClient)["error"] == "Incorrect signature.")
        let otherSecret = PrivatePubAuth.hmacSignature(secret: "nope", channel: "/d", timestamp: Self.ts)
        #expect(subscribeHMAC(h, cid, "/d", signature: otherSecret)["error"] == "Incorrect signature.")
        let good = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/d", timestamp: Self.ts)
        #expect(subscribeHMAC(h, cid, "/d", ts: "1700000000001", signature: good)["error"] == "Incorrect signature.")
        #expect(subscribeHMAC(h, cid, "/d", signature: good.uppercased())["error"] == "Incorrect signature.")
        // Wildcards need a signature for the exact pattern.
        #expect(subscribeHMAC(h, cid, "/d/*", signature: good)["error"] == "Incorrect signature.")
        let pattern = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/d/*", timestamp: Self.ts)
        #expect(subscribeHMAC(h, cid, "/d/*", signature: pattern)["successful"] == true)
    }

    @Test func hmacExpiryAndSkew() {
        let h = harness(.hmac)
        let cid = h.handshake()
        let old = "\(Self.nowMs - 3_601_000)"
        let oldSig = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/a", timestamp: old)
        #expect(subscribeHMAC(h, cid, "/a", ts: old, signature: oldSig)["error"] == "Signature has expired.")
        let future = "\(Self.nowMs + 301_000)"
        let futureSig = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/a", timestamp: future)
        #expect(
            subscribeHMAC(h, cid, "/a", ts: future, signature: futureSig)["error"]
                == "Signature timestamp is in the future.")
        let nearFuture = "\(Self.nowMs + 299_000)"
        let nearSig = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/a", timestamp: nearFuture)
        #expect(subscribeHMAC(h, cid, "/a", ts: nearFuture, signature: nearSig)["successful"] == true)
    }

    @Test func requiredBindingRefusesUnboundSignatures() {
        let h = harness(.hmac, binding: true)
        let cid = h.handshake()
        let unbound = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/a", timestamp: Self.ts)
        let reply = subscribeHMAC(h, cid, "/a", signature: unbound)
        #expect(reply["error"] == "Incorrect signature.")
        #expect(reply["successful"] == false)
        let bound = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/a", timestamp: Self.ts, clientId: cid)
        #expect(subscribeHMAC(h, cid, "/a", signature: bound)["successful"] == true)
    }

    @Test func bothModeAcceptsEitherScheme() {
        let h = harness(.both)
        let cid = h.handshake()
        #expect(subscribeSHA1(h, cid, "/a")["successful"] == true)
        let sig = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/b", timestamp: Self.ts)
        #expect(subscribeHMAC(h, cid, "/b", signature: sig)["successful"] == true)
        #expect(subscribeHMAC(h, cid, "/c", signature: sig)["error"] == "Incorrect signature.")
        #expect(
            h.reply(#"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"/c"}"#)["error"]
                == "Incorrect signature.")
    }

    @Test func refusedSubscriptionReceivesNothing() {
        let h = harness(.hmac)
        let cid = h.handshake()
        _ = h.connect(cid)
        let wrong = PrivatePubAuth.hmacSignature(secret: "secret", channel: "/other", timestamp: Self.ts)
        #expect(subscribeHMAC(h, cid, "/a", signature: wrong)["successful"] == false)
        #expect(h.reply(#"{"channel":"/a","data":1,"ext":{"private_pub_token":"secret"}}"#)["successful"] == true)
        guard case .connect(let c) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.events.isEmpty)
    }

    @Test func publishStillNeedsTheTokenInHMACMode() {
        let h = harness(.hmac, publicChannels: ["/**"])
        #expect(h.reply(#"{"channel":"/a","data":1}"#)["error"] == "Incorrect token.")
        #expect(h.reply(#"{"channel":"/a","data":1,"ext":{"private_pub_token":"secret"}}"#)["successful"] == true)
    }
}

@Suite struct PublicChannelTests {
    @Test func coverage() {
        let covers = PrivatePubAuth.pattern(_:covers:)
        #expect(covers("/news", "/news"))
        #expect(!covers("/news", "/news/today"))
        #expect(!covers("/news", "/news/*"))
        #expect(covers("/news/**", "/news/today"))
        #expect(covers("/news/**", "/news/sport/results"))
        #expect(covers("/news/**", "/news/*"))
        #expect(covers("/news/**", "/news/sport/**"))
        #expect(covers("/news/**", "/news/**"))
        #expect(!covers("/news/**", "/news"))
        #expect(!covers("/news/**", "/newsroom/a"))
        #expect(!covers("/news/**", "/**"))
        #expect(covers("/news/*", "/news/today"))
        #expect(covers("/news/*", "/news/*"))
        #expect(!covers("/news/*", "/news/**"))
        #expect(!covers("/news/*", "/news/sport/results"))
        #expect(!covers("/news/*", "/news"))
        #expect(covers("/**", "/anything/at/all"))
        #expect(covers("/**", "/**"))
        #expect(!covers("/news/**", "/news/bad channel"))
    }

    @Test func publicSubscriptionsNeedNoSignature() {
        let h = Harness(extensions: [
            PrivatePubAuth(secret: "secret", publicChannels: ["/news/**", "/status"], now: { 1_700_000_000_000 })
        ])
        let cid = h.handshake()
        _ = h.connect(cid)
        #expect(h.subscribe(cid, "/news/today")["successful"] == true)
        #expect(h.subscribe(cid, "/news/*")["successful"] == true)
        #expect(h.subscribe(cid, "/status")["successful"] == true)
        #expect(
            h.reply(#"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":["/status","/news/a"]}"#)[
                "successful"] == true)
        // Private ones still need a signature, also when mixed with public ones.
        #expect(h.subscribe(cid, "/private")["error"] == "Incorrect signature.")
        #expect(h.subscribe(cid, "/**")["error"] == "Incorrect signature.")
        #expect(
            h.reply(#"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":["/status","/private"]}"#)[
                "error"] == "Incorrect signature.")
        // A public channel still needs the token to publish, and its subscribers get the event.
        #expect(h.publish("/news/today")["error"] == "Incorrect token.")
        #expect(h.publish("/private", #"1,"ext":{"private_pub_token":"secret"}"#)["successful"] == true)
        #expect(h.publish("/news/today", #"2,"ext":{"private_pub_token":"secret"}"#)["successful"] == true)
        guard case .connect(let c) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        let events = c.result.events.map { try! JSONParser().parse($0.json).arrayValue![0].objectValue!["data"]! }
        #expect(events == [JSONValue(2)])  // one event per client, however many of its subscriptions match
    }
}
