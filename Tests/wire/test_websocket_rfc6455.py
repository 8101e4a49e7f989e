"""RFC 6455 over a raw socket: what the server must fail a WebSocket for, and how it answers a client's close.

A plain TCP client upgrades, then writes frames byte for byte as it likes (no client library to refuse a reserved
opcode or a bad close body) and reads the server's frames back: the close frame, its status code, and the end of
the connection. Every test ends by checking that the server still answers a handshake.
"""

import json

import pytest

from wirekit import CLOSE, CONT, PING, TEXT, RawWebSocket, handshake_msg, server_answers_handshake

pytestmark = pytest.mark.timeout(120)


def close_body(code, reason=b""):
    return code.to_bytes(2, "big") + reason


# ------------------------------------------------------------------ reserved opcodes (section 5.2)

@pytest.mark.parametrize("opcode", [3, 4, 5, 6, 7, 11, 12, 13, 14, 15])
def test_a_reserved_opcode_is_closed_with_1002_and_a_ping_after_it_is_not_answered(broker, opcode):
    with RawWebSocket(broker) as ws:
        ws.send(opcode, b"x")
        ws.send(PING, b"after")
        assert ws.recv_close_code() == 1002
    server_answers_handshake(broker)


# ------------------------------------------------------------------ close frames (sections 5.5.1, 7.4)

@pytest.mark.parametrize("code", [1000, 1001, 1003, 1008, 1011, 3000, 4000, 4999])
def test_a_close_is_answered_with_the_clients_status_code(broker, code):
    with RawWebSocket(broker) as ws:
        ws.send(CLOSE, close_body(code, b"bye"))
        assert ws.recv_close_code() == code
    server_answers_handshake(broker)


@pytest.mark.pubsub_only
@pytest.mark.parametrize("code", [1012, 1013, 1014])
def test_a_close_with_a_code_registered_after_the_rfc_is_echoed(broker, code):
    """Faye's driver knows only the codes of RFC 6455 itself."""
    with RawWebSocket(broker) as ws:
        ws.send(CLOSE, close_body(code))
        assert ws.recv_close_code() == code
    server_answers_handshake(broker)


@pytest.mark.pubsub_only
def test_an_empty_close_is_answered_with_an_empty_close(broker):
    """Faye answers an empty close with 1000; both are allowed, pubsub echoes what it got: nothing."""
    with RawWebSocket(broker) as ws:
        ws.send(CLOSE)
        assert ws.recv_close() == b""
    server_answers_handshake(broker)


@pytest.mark.parametrize("body", [
    b"\x03",
    *[close_body(code) for code in [0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000]],
    close_body(1000, b"\xff"),
    close_body(1000, b"bye \xc3"),
    close_body(4000, b"\xed\xa0\x80"),
], ids=["1-byte", "code-0", "code-999", "code-1004", "code-1005", "code-1006", "code-1015", "code-1016",
        "code-2999", "code-5000", "reason-ff", "reason-cut", "reason-surrogate"])
def test_a_bad_close_body_is_answered_with_1002(broker, body):
    with RawWebSocket(broker) as ws:
        ws.send(CLOSE, body)
        assert ws.recv_close_code() == 1002
    server_answers_handshake(broker)


# ------------------------------------------------------------------ UTF-8 in fragments (section 8.1)

@pytest.mark.pubsub_only
@pytest.mark.parametrize("fragment", [b'[{"channel":"\xff', b'[{"channel":"\xc3\x28', b'[{"id":"\xed\xa0\x80'],
                         ids=["ff", "bad-continuation", "surrogate"])
def test_invalid_utf8_in_a_text_fragment_is_closed_with_1007_before_the_message_ends(broker, fragment):
    """Faye checks the text of a message only when it ends."""
    with RawWebSocket(broker) as ws:
        ws.send(TEXT, fragment, fin=False)
        assert ws.recv_close_code() == 1007
    server_answers_handshake(broker)


def test_invalid_utf8_in_the_last_fragment_is_closed_with_1007(broker):
    with RawWebSocket(broker) as ws:
        ws.send(TEXT, b'[{"channel":"/a",', fin=False)
        ws.send(CONT, b'"id":"\xf0\x9f\x91"}]')
        assert ws.recv_close_code() == 1007
    server_answers_handshake(broker)


@pytest.mark.parametrize("split", [1, 2, 3])
def test_a_character_split_between_fragments_is_read_whole(broker, split):
    message = json.dumps([handshake_msg("\U0001F44B", ("websocket",))], ensure_ascii=False).encode()
    cut = message.index("\U0001F44B".encode()) + split
    with RawWebSocket(broker) as ws:
        ws.send(TEXT, message[:cut], fin=False)
        ws.send(CONT, message[cut:])
        fin, _, opcode, payload, _ = ws.recv_frame()
        assert (fin, opcode) == (True, TEXT), (opcode, payload)
        reply = json.loads(payload.decode("utf-8"))
        assert reply[0]["id"] == "\U0001F44B" and reply[0]["successful"] is True, reply
        ws.send(CLOSE, close_body(1000))
        assert ws.recv_close_code() == 1000
    server_answers_handshake(broker)
