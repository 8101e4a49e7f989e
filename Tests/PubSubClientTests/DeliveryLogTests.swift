import Bayeux
import Testing

@testable import PubSubClient

/// What a client hands on after a reconnect, when the broker sends again what it wrote before the connection broke
/// and a resume covers part of it too.
@Suite struct DeliveryLogTests {
    func event(_ channel: String, _ position: String?, _ n: Int) -> Message {
        var message = Message()
        message.channel = channel
        message["data"] = .object(["n": JSONValue(n)])
        if let position { message.ext = ["position": .string(position)] }
        return message
    }

    @Test func aMessageSentAgainIsHandedOnOnceAndLeavesThePositionWhereItWas() {
        var log = DeliveryLog(tracksPositions: true)
        log.positions[channel: "/feed/*"] = "2.e.start"
        let first = [event("/feed/a", "2.e.1", 1), event("/feed/a", "2.e.2", 2)]
        let handedOn = first.map { log.accept($0) }
        #expect(handedOn == [true, true])
        #expect(log.positions[channel: "/feed/*"] == "2.e.2")
        // The broker re-sends 2 (not confirmed before the socket died), then the resumed range 2, 3.
        let again = [event("/feed/a", "2.e.2", 2), event("/feed/a", "2.e.2", 2), event("/feed/a", "2.e.3", 3)]
        let handedOnAgain = again.map { log.accept($0) }
        #expect(handedOnAgain == [false, false, true])
        #expect(log.positions[channel: "/feed/*"] == "2.e.3")
    }

    @Test func withoutPositionsEveryMessageIsHandedOn() {
        var log = DeliveryLog(tracksPositions: true)
        log.positions[channel: "/feed/a"] = "2.e.start"
        let accepted = [event("/feed/a", nil, 1), event("/feed/a", nil, 1)].map { log.accept($0) }
        #expect(accepted == [true, true])
        #expect(log.positions[channel: "/feed/a"] == "2.e.start")
    }

    @Test func duplicatesAreDroppedEvenWhenTheClientDoesNotResume() {
        var log = DeliveryLog(tracksPositions: false)
        let accepted = [event("/a", "2.e.1", 1), event("/a", "2.e.1", 1)].map { log.accept($0) }
        #expect(accepted == [true, false])
        #expect(log.positions.byChannel.isEmpty)
    }

    @Test func theResumeAnswerIsReadFromASuccessfulSubscribeReply() {
        var reply = Message()
        reply.channel = Channel.subscribe
        reply["successful"] = true
        #expect(BayeuxClient.ResumeOutcome(reply: reply) == nil)
        reply.ext = ["resume": .object(["recovered": false, "missed": 4])]
        #expect(BayeuxClient.ResumeOutcome(reply: reply) == .init(recovered: false, missed: 4))
        reply.ext = ["resume": .object(["recovered": true])]
        #expect(BayeuxClient.ResumeOutcome(reply: reply) == .init(recovered: true, missed: 0))
        reply["successful"] = false
        #expect(BayeuxClient.ResumeOutcome(reply: reply) == nil)
    }
}
