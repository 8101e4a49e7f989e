import Bayeux
import NIOCore
import NIOEmbedded
import Testing

@testable import PubSubCore

/// `Broker.answer`: a publish the memory engine takes is answered at once, without a future; what has to wait
/// (a handshake, an engine that answers later) stays a future, and both give the same outcomes.
@Suite struct BrokerAnswerTests {
    let loop = EmbeddedEventLoop()
    let context = RequestContext(connectionType: .websocket)

    func elements(_ json: String) -> [MessageBatch.Element] {
        MessageBatch.elements(of: try! JSONParser().parse(json))!
    }

    func replies(_ outcomes: [Outcome]) -> [Message] {
        outcomes.compactMap { if case .reply(let m) = $0 { return m } else { return nil } }
    }

    @Test func aPublishToTheMemoryEngineIsAnsweredNow() throws {
        let broker = Broker()
        let answer = broker.answer(
            elements(#"[{"channel":"/a","data":1,"id":"7"}]"#), context: context, sink: nil, now: .now(), on: loop)
        guard case .now(.success(let outcomes)) = answer else {
            Issue.record("not answered at once: \(answer)")
            return
        }
        let reply = try #require(replies(outcomes).first)
        #expect(reply["successful"] == .bool(true))
        #expect(reply["id"] == .string("7"))
        #expect(reply.channel == "/a")
    }

    @Test func aRefusedPublishIsAnsweredNowWithItsError() throws {
        let answer = Broker().answer(
            elements(#"[{"channel":"/a/*","data":1,"id":"1"}]"#), context: context, sink: nil, now: .now(), on: loop)
        guard case .now(.success(let outcomes)) = answer else {
            Issue.record("not answered at once: \(answer)")
            return
        }
        let reply = try #require(replies(outcomes).first)
        #expect(reply["successful"] == .bool(false))
        #expect(reply.error?.hasPrefix("405:") == true)
    }

    @Test func aHandshakeOrSeveralMessagesWaitAndGiveTheSameOutcomes() throws {
        let broker = Broker()
        let handshake = broker.answer(
            elements(#"[{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["websocket"]}]"#),
            context: context, sink: nil, now: .now(), on: loop)
        guard case .later(let future) = handshake else {
            Issue.record("a handshake answered at once")
            return
        }
        loop.run()
        #expect(replies(try future.wait()).first?["successful"] == .bool(true))

        // Two publishes in one frame: one chain, replies in order.
        let two = broker.answer(
            elements(#"[{"channel":"/a","data":1,"id":"1"},{"channel":"/b","data":2,"id":"2"}]"#),
            context: context, sink: nil, now: .now(), on: loop)
        let outcomes = try two.future(on: loop).wait()
        #expect(replies(outcomes).map { $0["id"] } == [.string("1"), .string("2")])
    }

    @Test func eventualTransformsAsAFutureDoes() throws {
        struct Failed: Error {}
        let ready = Eventual<Int>.value(2).map { $0 * 10 }
        guard case .now(.success(20)) = ready else {
            Issue.record("map of a value: \(ready)")
            return
        }
        let recovered = Eventual<Int>.now(.failure(Failed())).flatMapErrorThrowing { _ in 5 }
        guard case .now(.success(5)) = recovered else {
            Issue.record("recovery of an error: \(recovered)")
            return
        }
        let rethrown = Eventual<Int>.now(.failure(Failed())).flatMapErrorThrowing { throw $0 }
        guard case .now(.failure(let error)) = rethrown, error is Failed else {
            Issue.record("an error thrown again: \(rethrown)")
            return
        }
        let later = Eventual<Int>.later(loop.makeFailedFuture(Failed())).flatMapErrorThrowing { _ in 3 }.map { $0 + 1 }
        #expect(try later.future(on: loop).wait() == 4)
    }
}
