"""Issue 13, item 6: binary WebSocket frames; and frames RFC 6455 says a server must refuse.

UTF-8 JSON in a binary frame is handled exactly like a text frame (Faye's Node server does so); anything else in
a binary frame gets the same Bayeux error reply as garbage in a text frame, and the session goes on.
"""

import json

import pytest
import websocket

from hostilekit import hostile_broker

HANDSHAKE = json.dumps([{"channel": "/meta/handshake", "version": "1.0", "id": "b1",
                         "supportedConnectionTypes": ["websocket"]}])


def _next_reply(ws, what):
    """The next data frame as parsed JSON; a close (today: 1003 for a binary frame) fails the test cleanly."""
    try:
        opcode, data = ws.recv_data(control_frame=True)
    except (websocket.WebSocketConnectionClosedException, ConnectionError) as e:
        raise AssertionError(f"{what}: the socket was closed ({e!r})") from None
    except websocket.WebSocketTimeoutException:
        raise AssertionError(f"{what}: no reply within the timeout") from None
    if opcode == websocket.ABNF.OPCODE_CLOSE:
        code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
        raise AssertionError(f"{what}: the broker closed the socket with {code}")
    return json.loads(data.decode("utf-8"))


def _shape(reply):
    """A reply without the fields that differ from one handshake to the next."""
    out = []
    for m in reply:
        m = dict(m)
        m.pop("clientId", None)
        if isinstance(m.get("ext"), dict):
            m["ext"] = sorted(m["ext"])
        out.append(m)
    return out


def test_binary_frame_with_json_is_handled_like_a_text_frame():
    with hostile_broker() as (b, g):
        ws = websocket.create_connection(b.ws_url, timeout=5)
        try:
            ws.send(HANDSHAKE)
            text_reply = _next_reply(ws, "text handshake")
            ws.send_binary(HANDSHAKE.encode("utf-8"))
            binary_reply = _next_reply(ws, "binary frame holding a JSON handshake")
            assert binary_reply[0]["successful"] is True, binary_reply
            assert _shape(binary_reply) == _shape(text_reply), (text_reply, binary_reply)
            # and the session goes on over binary frames
            cid = binary_reply[0]["clientId"]
            ws.send_binary(json.dumps([{"channel": "/meta/connect", "clientId": cid,
                                        "connectionType": "websocket"}]).encode())
            reply = _next_reply(ws, "binary connect")
            assert reply[0]["channel"] == "/meta/connect" and reply[0]["successful"] is True, reply
        finally:
            ws.close()
        g.assert_served()


@pytest.mark.parametrize("garbage", [b"this is not json", b"\xff\xfe\x00\x01garbage"], ids=["utf8", "not-utf8"])
def test_binary_frame_of_garbage_gets_an_error_reply_and_the_socket_goes_on(garbage):
    with hostile_broker() as (b, g):
        ws = websocket.create_connection(b.ws_url, timeout=5)
        try:
            ws.send("this is not json")
            text_reply = _next_reply(ws, "garbage in a text frame")
            ws.send_binary(garbage)
            reply = _next_reply(ws, f"garbage {garbage!r} in a binary frame")
            assert isinstance(reply, list) and reply and reply[0].get("successful") is False, reply
            assert reply == text_reply, (reply, text_reply)
            ws.send(HANDSHAKE)
            after = _next_reply(ws, "handshake after the garbage")
            assert after[0]["successful"] is True, after
        finally:
            ws.close()
        g.assert_served()


def _close_code_after(url, raw):
    """Sends `raw` after the upgrade, past the client library's framing; the close code the broker answers."""
    ws = websocket.create_connection(url, timeout=5)
    try:
        ws.sock.sendall(raw)
        opcode, data = ws.recv_data(control_frame=True)
        assert opcode == websocket.ABNF.OPCODE_CLOSE, (opcode, data)
        return int.from_bytes(data[:2], "big")
    finally:
        ws.close()


@pytest.mark.parametrize("raw", [
    b"\x81\x05hello",                                              # not masked (RFC 6455 section 5.1)
    bytes([0x81 | 0x40, 0x85]) + b"\x01\x02\x03\x04" + bytes(c ^ m for c, m in zip(b"hello", b"\x01\x02\x03\x04\x01")),
], ids=["unmasked", "reserved-bit"])
def test_frames_a_server_must_refuse_close_the_socket_with_1002(raw):
    with hostile_broker() as (b, g):
        assert _close_code_after(b.ws_url, raw) == 1002
        # The broker goes on serving others.
        ws = websocket.create_connection(b.ws_url, timeout=5)
        try:
            ws.send(HANDSHAKE)
            assert _next_reply(ws, "handshake on a new socket")[0]["successful"] is True
        finally:
            ws.close()
        g.assert_served()
