import NIOCore
import Testing

@testable import PubSubRedis

@Suite struct NodeMessageTests {
    @Test func roundTripsAndRejectsGarbage() {
        let messages: [NodeMessage] = [
            .event(sequence: 7, channel: "/a/b", event: ByteBuffer(string: "[{\"data\":\"1:2\"}]")),
            .adopt(clientId: "c1", connectedBefore: true, subscriptions: ["/a", "/b/**"]),
            .move(clientId: "c1", node: "n2"),
            .handoff(clientId: "c1", events: [ByteBuffer(string: "[1]"), ByteBuffer(string: "[2]")]),
            .subscribed(clientId: "c1", channels: ["/x"], events: [], resumed: []),
            .subscribed(clientId: "c1", channels: [], events: [ByteBuffer(string: "[1]")], resumed: ["/x", "/y/*"]),
            .unsubscribed(clientId: "c1", channels: ["/x", "/y"]),
            .destroyed(clientId: "c1", reason: "expired"),
            .barrier(3),
        ]
        for m in messages { #expect(NodeMessage.parse(m.encoded()) == m) }
        for garbage in ["", "Z", "E", "E1:x", "E99:", "A2:c1", "B1:x", "H2:c15:2"] {
            #expect(NodeMessage.parse(ByteBuffer(string: garbage)) == nil, "\(garbage)")
        }
    }
}
