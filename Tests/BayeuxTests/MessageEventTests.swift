import Bayeux
import NIOCore
import Testing

@Suite struct MessageEventTests {
    @Test func anEventIsAOneElementArrayWithTheFieldsInOrder() {
        var message = Message()
        message.channel = "/chat/room"
        message["data"] = .object(["text": .string("hé \u{2028}"), "n": .number("1.50")])
        message["ext"] = .object(["position": .string("7-3")])
        let event = message.encodedEvent()
        #expect(
            String(buffer: event)
                == #"[{"channel":"/chat/room","data":{"text":"hé \#u{2028}","n":1.50},"ext":{"position":"7-3"}}]"#
        )
    }

    @Test func theEventParsesBackToTheSameMessage() throws {
        var message = Message()
        message.channel = "/a"
        message["id"] = .string("9")
        message["data"] = .array([.null, .bool(true), .string("\"quoted\"\n")])
        let parsed = try JSONParser(maxDepth: 8).parse(String(buffer: message.encodedEvent()))
        #expect(parsed == .array([.object(message.fields)]))
    }
}
