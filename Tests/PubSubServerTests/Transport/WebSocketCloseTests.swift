import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing

@testable import PubSubServer

/// What `WebSocketHandler` answers to the frames RFC 6455 says fail a connection, and to a client's close: the
/// close frame it writes, then the socket closed.
@Suite struct WebSocketCloseTests {
    /// A WebSocket handler on a connected channel, its client handshaken.
    private func webSocket() throws -> EmbeddedChannel {
        let shared = ConnectionHandlerTests.makeShared(maxQueue: 100, recorder: ConnectionHandlerTests.LogRecorder())
        let channel = try ConnectionHandlerTests.connectedChannel()
        try channel.pipeline.syncOperations.addHandler(
            WebSocketHandler(shared: shared, remoteAddress: nil, eventLoop: channel.eventLoop))
        try ConnectionHandlerTests.sendFrame(ConnectionHandlerTests.handshake, channel)
        #expect(try WireFrames.written(channel).map(\.opcode) == [.text])
        return channel
    }

    /// Sends `frames`; returns the frames written back and whether the socket is closed.
    private func answer(to frames: [ByteBuffer], on channel: EmbeddedChannel) throws -> (
        written: [WebSocketFrameParser.Frame], closed: Bool
    ) {
        for frame in frames {
            try channel.writeInbound(frame)
            channel.embeddedEventLoop.run()
        }
        return (try WireFrames.written(channel), !channel.isActive)
    }

    private func closeBody(_ code: UInt16, _ reason: [UInt8] = []) -> [UInt8] {
        [UInt8(code >> 8), UInt8(code & 0xFF)] + reason
    }

    /// A close frame echoes the client's status code (RFC 6455 §5.5.1): with a code, that code; without, none.
    @Test func aClientsCloseIsEchoed() throws {
        for code: UInt16 in [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 4000, 4999] {
            let channel = try webSocket()
            let (written, closed) = try answer(
                to: [WireFrames.bytes(.connectionClose, closeBody(code, Array("bye".utf8)))], on: channel)
            #expect(written.map(\.opcode) == [.connectionClose], "code \(code)")
            #expect(written.first.map { Array($0.data.readableBytesView) } == closeBody(code), "code \(code)")
            #expect(closed)
        }
        let channel = try webSocket()
        let (written, closed) = try answer(to: [WireFrames.bytes(.connectionClose, [])], on: channel)
        #expect(written.map(\.opcode) == [.connectionClose])
        #expect(written.first?.data.readableBytes == 0, "an empty close is answered with an empty close")
        #expect(closed)
    }

    /// A close body of one byte, an invalid status code, or a reason that is not UTF-8 is answered with 1002.
    @Test func aBadCloseBodyIsAnsweredWith1002() throws {
        var bodies: [[UInt8]] = [[0x03]]
        for code: UInt16 in [0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000] { bodies.append(closeBody(code)) }
        bodies += [closeBody(1000, [0xFF]), closeBody(1000, [0x61, 0xE2, 0x82]), closeBody(4000, [0xED, 0xA0, 0x80])]
        for body in bodies {
            let channel = try webSocket()
            let (written, closed) = try answer(to: [WireFrames.bytes(.connectionClose, body)], on: channel)
            #expect(written.map(\.opcode) == [.connectionClose], "body \(body)")
            #expect(written.first?.data.peekWebSocketErrorCode() == .protocolError, "body \(body)")
            #expect(closed)
        }
    }

    /// A reserved opcode fails the connection with 1002 (RFC 6455 §5.2); a ping after it is not answered.
    @Test func aReservedOpcodeIsAnsweredWith1002AndNothingAfter() throws {
        for bits: UInt8 in [3, 4, 5, 6, 7, 11, 12, 13, 14, 15] {
            let channel = try webSocket()
            let opcode = try #require(WebSocketOpcode(encodedWebSocketOpcode: bits))
            let (written, closed) = try answer(
                to: [WireFrames.bytes(opcode, "x"), WireFrames.bytes(.ping, "p")], on: channel)
            #expect(written.map(\.opcode) == [.connectionClose], "opcode \(bits)")
            #expect(written.first?.data.peekWebSocketErrorCode() == .protocolError, "opcode \(bits)")
            #expect(closed)
        }
    }

    /// Text that is not UTF-8 in the first fragment of a message is answered with 1007 at once, before the
    /// message ends (RFC 6455 §8.1); a character split between fragments is not.
    @Test func invalidUTF8InAFragmentIsAnsweredWith1007AtOnce() throws {
        let channel = try webSocket()
        let (written, closed) = try answer(
            to: [WireFrames.bytes(.text, [0x5B, 0x22, 0xC3, 0x28], fin: false)], on: channel)
        #expect(written.map(\.opcode) == [.connectionClose])
        #expect(written.first?.data.peekWebSocketErrorCode() == .dataInconsistentWithMessage)
        #expect(closed)

        let split = try webSocket()
        let message = Array(#"[{"channel":"/meta/connect","clientId":"x","connectionType":"websocket","id":"é"}]"#.utf8)
        let cut = message.firstIndex(of: 0xC3)! + 1
        let answered = try answer(
            to: [
                WireFrames.bytes(.text, Array(message[..<cut]), fin: false),
                WireFrames.bytes(.continuation, Array(message[cut...])),
            ], on: split)
        #expect(answered.written.map(\.opcode) == [.text], "a reply, not a close")
        #expect(!answered.closed)
    }

    /// What a frame gets without the broker, through the connection's machine: a ping its pong (same payload),
    /// an empty batch `[]`, a frame that is not Bayeux a bad-request reply; the socket stays open. After the
    /// client's close, a ping in the same read gets nothing.
    @Test func framesAnsweredAtOnceGoThroughTheMachine() throws {
        let channel = try webSocket()
        var (written, closed) = try answer(to: [WireFrames.bytes(.ping, Array("hi".utf8))], on: channel)
        #expect(written.map(\.opcode) == [.pong] && written.first.map { String(buffer: $0.data) } == "hi")
        (written, closed) = try answer(to: [WireFrames.bytes(.text, Array("[]".utf8))], on: channel)
        #expect(written.map { String(buffer: $0.data) } == ["[]"])
        (written, closed) = try answer(to: [WireFrames.bytes(.text, Array("{\"x\":1}".utf8))], on: channel)
        #expect(written.count == 1 && String(buffer: written[0].data).contains("\"successful\":false"))
        (written, closed) = try answer(to: [WireFrames.bytes(.binary, [0x00, 0x01])], on: channel)
        #expect(written.count == 1 && String(buffer: written[0].data).contains("\"successful\":false"))
        #expect(!closed)
        var both = WireFrames.bytes(.connectionClose, closeBody(1000))
        var ping = WireFrames.bytes(.ping, [])
        both.writeBuffer(&ping)
        (written, closed) = try answer(to: [both], on: channel)
        #expect(written.map(\.opcode) == [.connectionClose])
        #expect(closed)
    }
}
