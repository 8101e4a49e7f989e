"""RFC 6455 over a raw socket: what the server must fail a WebSocket for, and how it answers a client's close.

A plain TCP client upgrades, then writes frames byte for byte as it likes (no client library to refuse a reserved
opcode or a bad close body) and reads the server's frames back: the close frame, its status code, and the end of
the connection. Every test ends by checking that the server still answers a handshake.
"""

import base64
import hashlib
import json
import os
import socket
import time

import pytest

from wirekit import HTTP_TIMEOUT, handshake_msg, server_answers_handshake

pytestmark = pytest.mark.timeout(120)

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CLOSE, PING, PONG, TEXT, CONT = 0x8, 0x9, 0xA, 0x1, 0x0


class RawWebSocket:
    """An upgraded TCP socket that sends masked frames and reads the server's unmasked ones."""

    def __init__(self, b, timeout=HTTP_TIMEOUT):
        self.sock = socket.create_connection(("127.0.0.1", b.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16))
        self.sock.sendall(b"GET /faye HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (b.port, key))
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            assert chunk, f"connection closed during the upgrade: {self.buffer!r}"
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        assert lines[0].startswith(b"HTTP/1.1 101"), lines[0]
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines[1:])}
        assert headers.get(b"sec-websocket-accept") == accept, headers

    @staticmethod
    def frame(opcode, payload=b"", fin=True, mask=b"\x37\xfa\x21\x3d"):
        n = len(payload)
        if n < 126:
            head = bytes([(0x80 if fin else 0) | opcode, 0x80 | n])
        elif n < 1 << 16:
            head = bytes([(0x80 if fin else 0) | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head = bytes([(0x80 if fin else 0) | opcode, 0x80 | 127]) + n.to_bytes(8, "big")
        return head + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(payload))

    def send(self, opcode, payload=b"", fin=True):
        self.sock.sendall(self.frame(opcode, payload, fin))

    def _read(self, n, deadline):
        while len(self.buffer) < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise AssertionError(f"nothing more from the server in time ({self.buffer!r} so far)") from None
            if not chunk:
                return None
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def recv_frame(self, timeout=HTTP_TIMEOUT):
        """(fin, opcode, payload) of the server's next frame; None when the connection ended before one."""
        deadline = time.monotonic() + timeout
        try:
            head = self._read(2, deadline)
            if head is None:
                return None
            assert head[1] & 0x80 == 0, "a server frame is never masked"
            n = head[1] & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2, deadline), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8, deadline), "big")
            payload = self._read(n, deadline) if n else b""
        except ConnectionResetError:
            return None
        return bool(head[0] & 0x80), head[0] & 0x0F, payload

    def recv_close(self, timeout=HTTP_TIMEOUT):
        """The body of the server's close frame, which must be the next frame, then the end of the connection."""
        frame = self.recv_frame(timeout)
        assert frame is not None, "the connection ended without a close frame"
        fin, opcode, payload = frame
        assert (fin, opcode) == (True, CLOSE), f"expected a close frame, got opcode {opcode}: {payload!r}"
        self.assert_ends()
        return payload

    def recv_close_code(self, timeout=HTTP_TIMEOUT):
        payload = self.recv_close(timeout)
        assert len(payload) >= 2, f"a close frame without a status code: {payload!r}"
        return int.from_bytes(payload[:2], "big")

    def assert_ends(self, timeout=HTTP_TIMEOUT):
        """The server closes the TCP connection (after its close frame, nothing more)."""
        frame = self.recv_frame(timeout)
        assert frame is None, f"a frame after the close: {frame!r}"

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


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
        fin, opcode, payload = ws.recv_frame()
        assert (fin, opcode) == (True, TEXT), (opcode, payload)
        reply = json.loads(payload.decode("utf-8"))
        assert reply[0]["id"] == "\U0001F44B" and reply[0]["successful"] is True, reply
        ws.send(CLOSE, close_body(1000))
        assert ws.recv_close_code() == 1000
    server_answers_handshake(broker)
