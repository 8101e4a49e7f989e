import Bayeux
import NIOCore
import Testing

@testable import PubSubCore

/// Stamps the connect replies it sees and swallows those of the client "gone".
private struct StampConnects: BayeuxExtension {
    func outgoing(_ reply: inout Message, context: RequestContext) -> Bool {
        guard reply.channel == "/meta/connect" else { return true }
        if reply.clientId == "gone" { return false }
        reply["ext"] = .object(["stamped": .bool(true)])
        return true
    }
}

@Suite struct BrokerOutcomesTests {
    let broker = Broker(extensions: ExtensionPipeline([StampConnects()]))
    let context = RequestContext(connectionType: .longPolling)

    func reply(_ channel: String, id: String) -> Message {
        var m = Message()
        m.channel = channel
        m["id"] = .string(id)
        return m
    }

    func event(_ n: Int) -> WireEvent {
        var m = Message()
        m.channel = "/e"
        m["data"] = .number(String(n))
        return WireEvent(encoding: m)
    }

    func connect(_ clientId: String, events: [WireEvent], answerNow: Bool) -> Outcome {
        let result = ConnectResult(status: .ok, events: CircularBuffer(events), attached: true, answerNow: answerNow)
        return .connect(
            PendingConnect(id: .string(clientId), clientId: clientId, advice: nil, result: result, hold: .seconds(45)))
    }

    @Test func repliesInOrderAConnectAnsweredNowFinishedAndItsEventsDelivered() {
        let outcomes: [Outcome] = [
            .reply(reply("/meta/subscribe", id: "1")),
            .none,
            connect("c", events: [event(1), event(2)], answerNow: true),
            .reply(reply("/chat", id: "3")),
        ]
        let (replies, events, pending) = broker.split(outcomes, context: context)
        #expect(replies.map { $0["id"] } == [.string("1"), .string("c"), .string("3")])
        // Only the connect reply is finished here: the others went through the extensions when they were made.
        #expect(replies.map { $0["ext"] } == [nil, .object(["stamped": .bool(true)]), nil])
        #expect(Array(events) == [event(1), event(2)])
        #expect(pending == nil)
    }

    @Test func aParkedConnectIsPendingAndItsQueuedEventsStillGoNow() {
        let (replies, events, pending) = broker.split(
            [connect("c", events: [event(7)], answerNow: false), .reply(reply("/meta/unsubscribe", id: "2"))],
            context: context)
        #expect(replies.map { $0["id"] } == [.string("2")])
        #expect(Array(events) == [event(7)])
        #expect(pending?.clientId == "c")
        #expect(pending?.reply["ext"] == nil)
    }

    @Test func aConnectReplyTheExtensionsSwallowIsNotSentButItsEventsAre() {
        let (replies, events, pending) = broker.split(
            [connect("gone", events: [event(1)], answerNow: true)], context: context)
        #expect(replies.isEmpty)
        #expect(Array(events) == [event(1)])
        #expect(pending == nil)
    }

    @Test func nothingToSayForNothing() {
        let (replies, events, pending) = broker.split([.none, .none], context: context)
        #expect(replies.isEmpty && events.isEmpty && pending == nil)
    }
}
