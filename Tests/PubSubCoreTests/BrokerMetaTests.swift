import Bayeux
import NIOCore
import NIOEmbedded
import PubSubTesting
import Testing

@testable import PubSubCore

@Suite struct HandshakeTests {
    @Test func successAdvertisesAllTypesAndAdvice() {
        let h = Harness(configuration: BrokerConfiguration(historySize: 0))
        let reply = h.reply(
            #"{"channel":"/meta/handshake","version":"2.0","supportedConnectionTypes":["long-polling"],"id":"1"}"#)
        #expect(reply["successful"] == true)
        #expect(reply["version"] == "1.0")
        #expect(reply["id"] == "1")
        #expect(reply["supportedConnectionTypes"] == ConnectionType.advertised)
        #expect(reply["advice"] == json(#"{"reconnect":"retry","interval":0,"timeout":45000}"#))
        #expect(reply["clientId"]?.stringValue?.count == 15)
        #expect(reply["ext"] == nil)
    }

    @Test func failures() {
        let h = Harness()
        let missingVersion = h.reply(
            #"{"channel":"/meta/handshake","supportedConnectionTypes":["long-polling"],"id":"2"}"#)
        #expect(missingVersion["error"] == "402:version:Missing required parameter")
        #expect(missingVersion["successful"] == false)
        #expect(missingVersion["clientId"] == nil)
        #expect(missingVersion["advice"] == json(#"{"reconnect":"handshake"}"#))
        #expect(missingVersion["supportedConnectionTypes"] == ConnectionType.advertised)
        let noCommon = h.reply(
            #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["iframe","flash"]}"#)
        #expect(noCommon["error"] == "301:iframe,flash:Connection types not supported")
        let noTypes = h.reply(#"{"channel":"/meta/handshake","version":"1.0"}"#)
        #expect(noTypes["error"] == "402:supportedConnectionTypes:Missing required parameter")
        // A later failure overwrites an earlier one.
        let both = h.reply(#"{"channel":"/meta/handshake","supportedConnectionTypes":["flash"]}"#)
        #expect(both["error"] == "301:flash:Connection types not supported")
    }
}

@Suite struct ConnectTests {
    @Test func validationErrorsDropClientIdAndAdviseHandshake() {
        let h = Harness()
        let cid = h.handshake()
        let unknown = h.reply(#"{"channel":"/meta/connect","clientId":"abc","connectionType":"long-polling","id":"4"}"#)
        #expect(
            unknown
                == json(
                    #"{"id":"4","channel":"/meta/connect","successful":false,"error":"401:abc:Unknown client","advice":{"reconnect":"handshake"}}"#
                ).objectValue)
        let missingType = h.reply(#"{"channel":"/meta/connect","clientId":"\#(cid)","id":"6"}"#)
        #expect(missingType["error"] == "402:connectionType:Missing required parameter")
        #expect(missingType["clientId"] == nil)
        let badType = h.reply(#"{"channel":"/meta/connect","clientId":"\#(cid)","connectionType":"iframe"}"#)
        #expect(badType["error"] == "301:iframe:Connection types not supported")
        let missingClient = h.reply(#"{"channel":"/meta/connect","connectionType":"long-polling"}"#)
        #expect(missingClient["error"] == "402:clientId:Missing required parameter")
    }

    @Test func firstConnectIsAnsweredAtOnceLaterOnesPark() throws {
        let h = Harness(configuration: BrokerConfiguration(historySize: 0))
        let cid = h.handshake()
        let sink = RecordingSink(loop: h.loop, persistent: false)
        guard case .connect(let first) = h.connect(cid, sink: sink) else {
            Issue.record("no connect")
            return
        }
        #expect(first.result.answerNow)
        #expect(!first.result.attached)
        guard case .connect(let second) = h.connect(cid, sink: sink) else {
            Issue.record("no connect")
            return
        }
        #expect(!second.result.answerNow)
        #expect(second.result.attached)
        #expect(second.hold == .seconds(45))
        // A publish releases the parked connect with the event, without the publisher's clientId.
        _ = h.subscribe(cid, "/foo/*")
        #expect(
            h.reply(
                #"{"channel":"/foo/bar","data":{"hello":"world"},"clientId":"\#(cid)","id":"18","ext":{"token":"x"}}"#)[
                    "successful"] == true)
        #expect(
            sink.events == [json(#"{"channel":"/foo/bar","data":{"hello":"world"},"id":"18","ext":{"token":"x"}}"#)])
    }

    @Test func queuedEventsAreReturnedByTheNextConnectInOrder() {
        let h = Harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        _ = h.subscribe(cid, "/q")
        for i in 1...3 { _ = h.publish("/q", "\(i)") }
        let sink = RecordingSink(loop: h.loop, persistent: false)
        guard case .connect(let c) = h.connect(cid, sink: sink) else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.answerNow)
        let data = c.result.events.map { try! JSONParser().parse($0.json).arrayValue![0].objectValue!["data"]! }
        #expect(data == [1, 2, 3])
    }

    @Test func identicalEventsAreNotCollapsed() {
        let h = Harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        _ = h.subscribe(cid, "/q")
        _ = h.publish("/q")
        _ = h.publish("/q")
        guard case .connect(let c) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.events.count == 2)
    }

    @Test func supersededParkedConnectIsReleased() {
        let h = Harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        let first = RecordingSink(loop: h.loop, persistent: false)
        _ = h.connect(cid, sink: first)
        let second = RecordingSink(loop: h.loop, persistent: false)
        _ = h.connect(cid, sink: second)
        h.loop.run()
        #expect(first.detaches == [.superseded])
        #expect(second.detaches.isEmpty)
    }

    @Test func clientAdviceTimeoutShortensTheHoldAndEventSourceAnswersAtOnce() {
        let h = Harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        let sink = RecordingSink(loop: h.loop, persistent: false)
        let zero = h.send(
            #"{"channel":"/meta/connect","clientId":"\#(cid)","connectionType":"long-polling","advice":{"timeout":0}}"#,
            sink: sink)
        guard case .connect(let c) = zero[0] else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.answerNow && !c.result.attached)
        let es = h.send(#"{"channel":"/meta/connect","clientId":"\#(cid)","connectionType":"eventsource"}"#, sink: sink)
        guard case .connect(let e) = es[0] else {
            Issue.record("no connect")
            return
        }
        #expect(e.result.answerNow)
        #expect(e.reply["advice"] == json(#"{"reconnect":"retry","interval":45000,"timeout":0}"#))
    }

    @Test func otherMessagesInTheRequestMeanTheConnectIsNotParked() {
        let h = Harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        let sink = RecordingSink(loop: h.loop, persistent: false)
        let outcomes = h.send(
            #"[{"channel":"/meta/connect","clientId":"\#(cid)","connectionType":"long-polling"},{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":"/x"}]"#,
            sink: sink)
        guard case .connect(let c) = outcomes[0] else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.answerNow && !c.result.attached)
    }
}

@Suite struct SubscribeTests {
    @Test func arraySubscriptionRoutesWildcards() {
        let h = Harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        let reply = h.reply(
            #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":["/a/b","/a/*","/x/**"],"id":"10"}"#)
        #expect(
            reply
                == json(
                    #"{"id":"10","clientId":"\#(cid)","channel":"/meta/subscribe","successful":true,"subscription":["/a/b","/a/*","/x/**"]}"#
                ).objectValue)
        _ = h.publish("/a/zz", #""a""#)
        _ = h.publish("/x/y/z", #""x""#)
        _ = h.publish("/a/b/c", #""no""#)
        _ = h.publish("/a/b", #""once""#)
        guard case .connect(let c) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        let data = c.result.events.map { try! JSONParser().parse($0.json).arrayValue![0].objectValue!["data"]! }
        #expect(data == ["a", "x", "once"])
    }

    @Test func errorsInFayeOrder() {
        let h = Harness()
        let cid = h.handshake()
        #expect(h.subscribe(cid, "/meta/foo")["error"] == "403:/meta/foo:Forbidden channel")
        #expect(h.subscribe(cid, "/service/foo")["error"] == "403:/service/foo:Forbidden channel")
        #expect(h.subscribe(cid, "/meta/**")["error"] == "403:/meta/**:Forbidden channel")
        #expect(h.subscribe(cid, "foo")["error"] == "405:foo:Invalid channel")
        #expect(h.subscribe(cid, "/foo/*/bar")["error"] == "405:/foo/*/bar:Invalid channel")
        let missing = h.reply(#"{"channel":"/meta/subscribe","clientId":"\#(cid)","id":"14"}"#)
        #expect(
            missing
                == json(
                    #"{"id":"14","clientId":"\#(cid)","channel":"/meta/subscribe","successful":false,"error":"402:subscription:Missing required parameter","subscription":[]}"#
                ).objectValue)
        let unknown = h.subscribe("nope", "/a")
        #expect(unknown["error"] == "401:nope:Unknown client")
        #expect(unknown["clientId"] == "nope")
        let noClient = h.reply(#"{"channel":"/meta/subscribe","subscription":"/a"}"#)
        #expect(noClient["error"] == "402:clientId:Missing required parameter")
    }

    @Test func channelsBeforeTheInvalidOneStaySubscribed() {
        let h = Harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        let reply = h.reply(
            #"{"channel":"/meta/subscribe","clientId":"\#(cid)","subscription":["/ok/1","bad","/ok/2"]}"#)
        #expect(reply["error"] == "405:bad:Invalid channel")
        _ = h.publish("/ok/1")
        _ = h.publish("/ok/2")
        guard case .connect(let c) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.events.count == 1)
    }

    @Test func unsubscribeAndLimits() {
        let h = Harness(configuration: BrokerConfiguration(maxSubscriptionsPerClient: 2, maxChannelLength: 10))
        let cid = h.handshake()
        #expect(
            h.reply(#"{"channel":"/meta/unsubscribe","clientId":"\#(cid)","subscription":"/never"}"#)["successful"]
                == true)
        #expect(h.subscribe(cid, "/a")["successful"] == true)
        #expect(h.subscribe(cid, "/a")["successful"] == true)
        #expect(h.subscribe(cid, "/b")["successful"] == true)
        #expect(h.subscribe(cid, "/c")["error"] == "403:/c:Subscription limit reached")
        #expect(h.subscribe(cid, "/abcdefghijk")["error"] == "405::Channel name too long")
        #expect(
            h.reply(#"{"channel":"/meta/unsubscribe","clientId":"\#(cid)","subscription":"/a"}"#)["successful"] == true)
        #expect(h.subscribe(cid, "/c")["successful"] == true)
    }
}

@Suite struct PublishTests {
    @Test func validation() {
        let h = Harness()
        #expect(
            h.reply(#"{"channel":"/foo/bar","data":"x","id":"19"}"#)
                == json(#"{"id":"19","channel":"/foo/bar","successful":true}"#).objectValue)
        #expect(h.reply(#"{"channel":"/foo/bar","data":"x","clientId":"bogus"}"#)["clientId"] == "bogus")
        #expect(h.reply(#"{"channel":"/foo/bar","id":"20"}"#)["error"] == "402:data:Missing required parameter")
        #expect(h.reply(#"{"channel":"/foo/*","data":1}"#)["error"] == "405:/foo/*:Invalid channel")
        #expect(
            h.reply(#"{"data":1,"id":"24"}"#)
                == json(#"{"id":"24","successful":false,"error":"405::Invalid channel"}"#).objectValue)
        #expect(h.reply(#"{"channel":"/a.b","data":1}"#)["error"] == "405:/a.b:Invalid channel")
    }

    @Test func metaChannelsAreMatchedExactly() {
        let h = Harness()
        let cid = h.handshake()
        let reply = h.reply(#"{"channel":"/meta/subscribe/x","clientId":"\#(cid)","subscription":"/zzz"}"#)
        #expect(reply["error"] == "403:/meta/subscribe/x:Forbidden channel")
        _ = h.connect(cid)
        _ = h.publish("/zzz")
        guard case .connect(let c) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.events.isEmpty)
    }

    @Test func serviceChannelsReachDeepWildcardSubscribers() {
        let h = Harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        _ = h.subscribe(cid, "/**")
        _ = h.publish("/service/foo")
        guard case .connect(let c) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.events.count == 1)
    }

    @Test func aRequestOverTheMessageLimitIsRefusedWholeWithOneReply() {
        let h = Harness(configuration: BrokerConfiguration(maxMessagesPerRequest: 2))
        let cid = h.handshake()
        _ = h.connect(cid)
        _ = h.subscribe(cid, "/a")
        let replies = h.replies(
            #"[{"channel":"/a","data":1,"id":"1"},{"channel":"/a","data":2,"id":"2"},{"channel":"/a","data":3,"id":"3"}]"#
        )
        #expect(replies == [json(#"{"error":"413:2:Too many messages in one request","successful":false}"#)])
        // Nothing of it was handled: not even the messages within the limit were published.
        guard case .connect(let c) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        #expect(c.result.events.isEmpty)
        // At the limit, every message is handled and answered.
        let atLimit = h.replies(#"[{"channel":"/a","data":4,"id":"4"},{"channel":"/a","data":5,"id":"5"}]"#)
        #expect(atLimit.map { $0.objectValue?["successful"] } == [true, true])
        guard case .connect(let c2) = h.connect(cid) else {
            Issue.record("no connect")
            return
        }
        #expect(c2.result.events.count == 2)
    }

    @Test func aHugeBodyOfNonObjectsGetsOneReply() {
        let h = Harness()
        let body = "[" + Array(repeating: "1", count: 500_000).joined(separator: ",") + "]"
        let replies = h.replies(body)
        #expect(replies == [json(#"{"error":"413:1000:Too many messages in one request","successful":false}"#)])
    }

    @Test func theRefusalGoesThroughTheOutgoingExtensions() {
        struct Stamp: BayeuxExtension {
            func outgoing(_ reply: inout Message, context: RequestContext) -> Bool {
                reply.fields["ext"] = .object(["stamped": .bool(true)])
                return true
            }
        }
        let h = Harness(configuration: BrokerConfiguration(maxMessagesPerRequest: 1), extensions: [Stamp()])
        let replies = h.replies(#"[{"channel":"/a","data":1},{"channel":"/a","data":2}]"#)
        #expect(replies.count == 1)
        #expect(replies[0].objectValue?["ext"] == json(#"{"stamped":true}"#))
    }

    @Test func nonObjectElementsGetAnErrorReply() {
        let h = Harness()
        let replies = h.replies(#"[1,{"channel":"/a","data":1}]"#)
        #expect(replies[0] == json(#"{"error":"400::Bad request","successful":false}"#))
        #expect(replies[1].objectValue?["successful"] == true)
    }
}

@Suite struct SessionLifecycleTests {
    @Test func expiresAfterTwiceTheTimeoutWithoutConnect() {
        var h = Harness(configuration: BrokerConfiguration(timeout: .seconds(5)))
        let cid = h.handshake()
        h.broker.engine.sweep(now: h.now + .seconds(9))
        #expect(h.subscribe(cid, "/a")["successful"] == true)
        h.now = h.now + .seconds(9)
        _ = h.connect(cid)  // restarts the timer
        h.broker.engine.sweep(now: h.now + .seconds(9))
        #expect(h.subscribe(cid, "/a")["successful"] == true)
        h.broker.engine.sweep(now: h.now + .seconds(10))
        let reply = h.reply(#"{"channel":"/meta/connect","clientId":"\#(cid)","connectionType":"long-polling"}"#)
        #expect(reply["error"] == .string("401:\(cid):Unknown client"))
        #expect(reply["advice"] == json(#"{"reconnect":"handshake"}"#))
    }

    @Test func expiryReleasesAParkedConnect() {
        let h = Harness(configuration: BrokerConfiguration(timeout: .seconds(5)))
        let cid = h.handshake()
        _ = h.connect(cid)
        let sink = RecordingSink(loop: h.loop, persistent: false)
        _ = h.connect(cid, sink: sink)
        h.broker.engine.sweep(now: h.now + .seconds(10))
        h.loop.run()
        #expect(sink.detaches == [.expired])
    }

    @Test func disconnect() {
        let h = Harness()
        let cid = h.handshake()
        _ = h.connect(cid)
        let sink = RecordingSink(loop: h.loop, persistent: false)
        _ = h.connect(cid, sink: sink)
        #expect(
            h.reply(#"{"channel":"/meta/disconnect","clientId":"\#(cid)","id":"30"}"#)
                == json(#"{"id":"30","clientId":"\#(cid)","channel":"/meta/disconnect","successful":true}"#).objectValue
        )
        h.loop.run()
        #expect(sink.detaches == [.disconnected])
        #expect(
            h.reply(#"{"channel":"/meta/disconnect","clientId":"\#(cid)","id":"31"}"#)
                == json(
                    #"{"id":"31","channel":"/meta/disconnect","successful":false,"error":"401:\#(cid):Unknown client"}"#
                ).objectValue)
        #expect(h.reply(#"{"channel":"/meta/disconnect"}"#)["error"] == "402:clientId:Missing required parameter")
    }

    @Test func overflowDropsTheClientAndSaysSo() {
        let h = Harness(configuration: BrokerConfiguration(maxQueue: 3))
        let cid = h.handshake()
        let other = h.handshake()
        _ = h.connect(cid)
        _ = h.connect(other)
        _ = h.subscribe(cid, "/q")
        _ = h.subscribe(other, "/q")
        let ws = RecordingSink(loop: h.loop, persistent: true)
        _ = h.send(#"{"channel":"/meta/connect","clientId":"\#(other)","connectionType":"websocket"}"#, sink: ws)
        for _ in 0..<4 { _ = h.publish("/q") }
        h.loop.run()
        #expect(ws.events.count == 4)  // a client that keeps up is unaffected
        let reply = h.reply(#"{"channel":"/meta/connect","clientId":"\#(cid)","connectionType":"long-polling"}"#)
        #expect(reply["error"] == .string("409:\(cid):Queue overflow"))
        #expect(reply["advice"] == json(#"{"reconnect":"handshake"}"#))
        #expect(h.broker.engine.statistics.overflowDrops == 1)
    }

    @Test func persistentSinkGetsEventsBatched() {
        let h = Harness()
        let cid = h.handshake()
        let ws = RecordingSink(loop: h.loop, persistent: true)
        _ = h.send(#"{"channel":"/meta/connect","clientId":"\#(cid)","connectionType":"websocket"}"#, sink: ws)
        _ = h.subscribe(cid, "/q")
        _ = h.publish("/q", "1")
        _ = h.publish("/q", "2")
        h.loop.run()
        #expect(ws.events.map { $0.objectValue!["data"]! } == [1, 2])
    }
}

@Suite struct ExtensionTests {
    struct Veto: BayeuxExtension {
        func incoming(_ message: inout Message, context: RequestContext) -> Bool {
            if message.channel == "/secret" { message.error = "403::Authentication required" }
            return message.channel != "/swallowed"
        }
        func outgoing(_ reply: inout Message, context: RequestContext) -> Bool {
            if reply.channel == Channel.handshake { reply["ext"] = .object(["seen": true]) }
            return true
        }
    }

    @Test func vetoSwallowAndOutgoing() {
        let h = Harness(extensions: [Veto()])
        #expect(h.reply(#"{"channel":"/secret","data":1}"#)["error"] == "403::Authentication required")
        #expect(h.send(#"{"channel":"/swallowed","data":1}"#).count == 1)
        if case .none = h.send(#"{"channel":"/swallowed","data":1}"#)[0] {} else { Issue.record("not swallowed") }
        let handshake = h.reply(
            #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)
        #expect(handshake["ext"] == json(#"{"seen":true}"#))
    }
}
