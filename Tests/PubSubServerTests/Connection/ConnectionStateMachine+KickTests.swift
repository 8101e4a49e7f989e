import Bayeux
import NIOCore
import Testing

@testable import PubSubCore
@testable import PubSubServer

/// A session removed by the server API (`DetachReason.kicked`): its held connect is answered with
/// `advice.reconnect: "none"` on every transport, and a WebSocket then closes normally.
@Suite struct ConnectionStateMachineKickTests {
    typealias Machine = ConnectionStateMachine

    static func kickedReply(_ action: Machine.Action) -> Message? {
        switch action {
        case .answer(let answer), .close(_, .some(let answer), _): answer.kicked ? answer.reply : nil
        default: nil
        }
    }

    static func expectTellsNotToReconnect(_ reply: Message?, clientId: String) {
        #expect(reply?["advice"] == Advice.none)
        #expect(reply?["successful"] == false)
        #expect(reply?.error == "401:\(clientId):Unknown client")
        #expect(reply?.clientId == nil)
    }

    @Test func webSocketAnswersTheHeldConnectThenClosesNormally() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        _ = m.messagesHandled(replies: [], events: [], pending: ConnectionStateMachineTests.connect("a"))
        let actions = m.detached(.kicked)
        #expect(ConnectionStateMachineTests.describe(actions) == ["answer(c)", "close(normal)"])
        Self.expectTellsNotToReconnect(Self.kickedReply(actions), clientId: "a")
        #expect(!m.isOpen && m.clientId == nil)
    }

    @Test func webSocketWithoutAHeldConnectClosesNormally() {
        var m = Machine(transport: .webSocket, maxQueue: 10)
        _ = m.bind(clientId: "a")
        #expect(ConnectionStateMachineTests.describe(m.detached(.kicked)) == ["close(normal)"])
    }

    @Test func pollingAnswersTheParkedConnect() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        _ = m.messagesHandled(replies: [], events: [], pending: ConnectionStateMachineTests.connect("a"))
        let actions = m.detached(.kicked)
        #expect(ConnectionStateMachineTests.describe(actions) == ["answer(c)"])
        Self.expectTellsNotToReconnect(Self.kickedReply(actions), clientId: "a")
        #expect(m.isOpen, "a polling connection goes on after its answer")
    }

    @Test func pollingKickedBeforeTheConnectParksIsAnsweredWhenItDoes() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        #expect(ConnectionStateMachineTests.describe(m.detached(.kicked)) == [])
        let actions = m.messagesHandled(replies: [], events: [], pending: ConnectionStateMachineTests.connect("a"))
        Self.expectTellsNotToReconnect(Self.kickedReply(actions), clientId: "a")
    }

    @Test func otherReasonsDoNotSayNone() {
        var m = Machine(transport: .polling, maxQueue: 10)
        _ = m.requestStarted()
        _ = m.messagesHandled(replies: [], events: [], pending: ConnectionStateMachineTests.connect("a"))
        #expect(Self.kickedReply(m.detached(.expired)) == nil)
    }

    @Test func eventSourceStreamEndsNormally() {
        var m = Machine(transport: .polling, maxQueue: 10)
        m.streamOpened(clientId: "a")
        #expect(ConnectionStateMachineTests.describe(m.detached(.kicked)) == ["close(normal)"])
    }
}
