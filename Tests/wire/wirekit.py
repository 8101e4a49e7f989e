"""Wire helpers: servers, HTTP, WebSocket, raw socket and EventSource clients for the Bayeux suites.

Run against the Swift server:   pytest Tests/wire
Run against real Faye 1.4.0:    PUBSUB_TARGET=faye pytest Tests/wire
"""

import base64
import collections
import hashlib
import json
import os
import re
import socket
import time

import pytest
import requests
import websocket

from pubsubtest.broker import Broker, target

# ---------------------------------------------------------------- constants

ALL6 = ["long-polling", "cross-origin-long-polling", "callback-polling",
        "websocket", "eventsource", "in-process"]

CLIENT_ID_RE = re.compile(r"^[0-9a-z]{31}$")

# PROTOCOL.md section 1: ddd:STRING(,STRING)*:STRING or ddd::STRING
_S = r"[A-Za-z0-9\-_!~()$@ /*.]*"
ERROR_RE = re.compile(rf"^([0-9]{{3}}:{_S}(,{_S})*:{_S}|[0-9]{{3}}::{_S})$")

HTTP_TIMEOUT = 10          # seconds for any request that must be answered promptly
QUIET = 1.0                # how long "nothing arrives" is watched for


class Pattern:
    """Compares equal to any string matching the regex; use inside expected replies."""

    def __init__(self, regex):
        self.regex = re.compile(regex) if isinstance(regex, str) else regex

    def __eq__(self, other):
        return isinstance(other, str) and self.regex.match(other) is not None

    def __ne__(self, other):
        return not self.__eq__(other)

    def __repr__(self):
        return f"<matching {self.regex.pattern}>"


ANY_CLIENT_ID = Pattern(CLIENT_ID_RE)
ANY_ERROR = Pattern(ERROR_RE)


def advice_ok(timeout_s, interval_s=0):
    return {"reconnect": "retry", "interval": int(interval_s * 1000), "timeout": int(timeout_s * 1000)}


ADVICE_HANDSHAKE = {"reconnect": "handshake"}

POSITION_RE = re.compile(r"^2\.[0-9a-z]+\.[0-9a-z]+$")


def without_positions(value):
    """pubsub adds `ext.position` to handshake replies and delivered events (its resume extension, tested in
    test_resume.py; Faye clients ignore it). The exact-reply checks here compare everything else: the field is
    checked for its form and removed, and an `ext` that held nothing else goes with it."""
    if isinstance(value, list):
        return [without_positions(v) for v in value]
    if isinstance(value, dict) and isinstance(value.get("ext"), dict) and "position" in value["ext"]:
        assert target() == "pubsub", value
        assert POSITION_RE.match(value["ext"]["position"]), value
        value = dict(value)
        value["ext"] = {k: v for k, v in value["ext"].items() if k != "position"}
        if not value["ext"]:
            del value["ext"]
    return value


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def broker():
    """Server with the PrivatePub-style timeout of 45 s (advice timeout 45000)."""
    with Broker(timeout=45) as b:
        yield b


SHORT_TIMEOUT = 2


@pytest.fixture(scope="module")
def short_broker():
    """Server with a 2 s timeout, for tests that wait for a hold or an expiry."""
    with Broker(timeout=SHORT_TIMEOUT) as b:
        yield b


# ---------------------------------------------------------------- HTTP helpers

def post_raw(b, body, *, content_type="application/json", timeout=HTTP_TIMEOUT, headers=None,
             path="", method="POST"):
    """POST a body (str, bytes or JSON-able object) and return the requests.Response."""
    if not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8")
    h = {}
    if content_type is not None:
        h["Content-Type"] = content_type
    h.update(headers or {})
    return requests.request(method, b.url + path, data=body, headers=h, timeout=timeout)


def post(b, body, *, timeout=HTTP_TIMEOUT, **kw):
    """POST JSON and return the parsed JSON reply (asserting HTTP 200 and a JSON array)."""
    r = post_raw(b, body, timeout=timeout, **kw)
    assert r.status_code == 200, f"HTTP {r.status_code} {r.text!r} for {body!r}\n{b.log()[-2000:]}"
    assert r.headers.get("Content-Type") == "application/json; charset=utf-8", r.headers
    reply = without_positions(r.json())
    assert isinstance(reply, list), reply
    return reply


def timed_post(b, body, *, timeout=HTTP_TIMEOUT, **kw):
    t0 = time.monotonic()
    reply = post(b, body, timeout=timeout, **kw)
    return reply, time.monotonic() - t0


def handshake_msg(id="1", types=("long-polling",)):
    return {"channel": "/meta/handshake", "version": "1.0",
            "supportedConnectionTypes": list(types), "id": id}


def handshake(b, types=("long-polling",)):
    """Handshake over HTTP and return the clientId."""
    reply = post(b, [handshake_msg("hs", types)])
    assert len(reply) == 1 and reply[0].get("successful") is True, reply
    cid = reply[0]["clientId"]
    assert CLIENT_ID_RE.match(cid), cid
    return cid


def connect_msg(cid, id="c", ctype="long-polling", advice_timeout=None):
    m = {"channel": "/meta/connect", "clientId": cid, "connectionType": ctype, "id": id}
    if advice_timeout is not None:
        m["advice"] = {"timeout": advice_timeout}
    return m


def connect_now(b, cid, id="c0"):
    """A /meta/connect with advice.timeout 0: answered at once by Faye and pubsub alike.

    Used to make the following connects behave the same on both servers (pubsub answers
    the first connect after a handshake at once, Faye holds it)."""
    reply, elapsed = timed_post(b, [connect_msg(cid, id, advice_timeout=0)])
    assert reply[0] == {"id": id, "clientId": cid, "channel": "/meta/connect", "successful": True,
                        "advice": advice_ok(b.timeout, b.interval)}, reply
    assert elapsed < 3, elapsed
    return reply[1:]


def subscribe(b, cid, subscription, id="s"):
    reply = post(b, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": subscription, "id": id}])
    assert reply == [{"id": id, "clientId": cid, "channel": "/meta/subscribe", "successful": True,
                      "subscription": subscription}], reply


def publish(b, channel, data, id=None, **extra):
    msg = {"channel": channel, "data": data}
    if id is not None:
        msg["id"] = id
    msg.update(extra)
    reply = post(b, [msg])
    expected = {"channel": channel, "successful": True}
    if id is not None:
        expected["id"] = id
    if "clientId" in extra:
        expected["clientId"] = extra["clientId"]
    assert reply == [expected], reply


def start_connect(pool, b, cid, id="c1", timeout=None, **kw):
    """Send a /meta/connect in the background; returns a future of (reply, elapsed)."""
    if timeout is None:
        timeout = b.timeout + 15
    return pool.submit(timed_post, b, [connect_msg(cid, id, **kw)], timeout=timeout)


def wait_parked(b, seconds=0.5):
    """Give a background request time to reach the server and be parked."""
    time.sleep(seconds)


def server_answers_handshake(b):
    """The common tail of every bad-input test: the server is alive and still speaks Bayeux."""
    assert b.alive(), f"server process died (rc={b.returncode}):\n{b.log()[-3000:]}"
    reply = post(b, [handshake_msg("alive")])
    assert reply == [{"id": "alive", "channel": "/meta/handshake", "successful": True, "version": "1.0",
                      "supportedConnectionTypes": ALL6, "clientId": ANY_CLIENT_ID,
                      "advice": advice_ok(b.timeout, b.interval)}], reply


# ---------------------------------------------------------------- WebSocket helpers

class Closing:
    """A connection used in a `with` block: closed at its end (the class defines `close`)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class WS(Closing):
    """A websocket-client connection with JSON helpers and bounded waits."""

    def __init__(self, b, timeout=HTTP_TIMEOUT, **kw):
        self.sock = websocket.create_connection(b.ws_url, timeout=timeout, **kw)

    def send(self, obj):
        self.sock.send(obj if isinstance(obj, str) else json.dumps(obj))

    def send_bytes(self, data, opcode=websocket.ABNF.OPCODE_BINARY):
        self.sock.send(data, opcode=opcode)

    def recv(self, timeout=HTTP_TIMEOUT):
        """Next text frame as parsed JSON; raises websocket.WebSocketTimeoutException on timeout."""
        self.sock.settimeout(timeout)
        opcode, data = self.sock.recv_data()
        assert opcode == websocket.ABNF.OPCODE_TEXT, (opcode, data)
        return without_positions(json.loads(data.decode("utf-8")))

    def timed_recv(self, timeout=HTTP_TIMEOUT):
        t0 = time.monotonic()
        msg = self.recv(timeout)
        return msg, time.monotonic() - t0

    def assert_quiet(self, seconds=QUIET):
        """Nothing arrives on the socket for `seconds`."""
        self.sock.settimeout(seconds)
        try:
            opcode, data = self.sock.recv_data()
        except websocket.WebSocketTimeoutException:
            return
        raise AssertionError(f"unexpected frame {opcode}: {data!r}")

    def recv_close(self, timeout=HTTP_TIMEOUT):
        """Wait for the server's close frame; return its status code (None if the TCP closed without one)."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                frame = self.sock.recv_frame()
            except websocket.WebSocketConnectionClosedException:
                return None
            except (ConnectionResetError, BrokenPipeError):
                return None
            if frame is None:
                return None
            if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
                if len(frame.data) >= 2:
                    return int.from_bytes(frame.data[:2], "big")
                return 1005
        raise AssertionError("no close frame in time")

    def handshake(self, id="wh"):
        self.send([handshake_msg(id, ("websocket",))])
        reply = self.recv()
        assert len(reply) == 1 and reply[0]["successful"] is True, reply
        return reply[0]["clientId"]

    def close(self):
        try:
            self.sock.close(timeout=1)
        except Exception:
            pass


# ---------------------------------------------------------------- raw socket helpers

def raw_http(b, request_bytes, *, timeout=HTTP_TIMEOUT, read_limit=1 << 20):
    """Send raw bytes, read until the server closes or `timeout`; returns (status, headers, body).

    Tolerates the server closing early (e.g. a 413 sent before the whole body was read)."""
    s = socket.create_connection(("127.0.0.1", b.port), timeout=timeout)
    try:
        try:
            s.sendall(request_bytes)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(data) < read_limit:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
                if m and len(body) >= int(m.group(1)):
                    break
    finally:
        s.close()
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, f"no HTTP response head in {data[:200]!r}"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


# ---------------------------------------------------------------- a raw WebSocket (RFC 6455 byte for byte)

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
RSV1, RSV2, RSV3 = 0x40, 0x20, 0x10

# A server frame: `rsv` holds the RSV bits in place (RSV1 is 0x40), `size` is the frame's bytes on the wire.
Frame = collections.namedtuple("Frame", "fin rsv opcode payload size")


class RawWebSocket(Closing):
    """An upgraded TCP socket, with an optional `Sec-WebSocket-Extensions` offer, that sends masked frames as the
    test writes them (any opcode, RSV bits, fragments) and reads the server's unmasked ones with their RSV bits.

    `extensions` is the server's one Sec-WebSocket-Extensions answer, None without one; `headers` maps each
    lower-cased response header to its values."""

    MASK = b"\x37\xfa\x21\x3d"
    SKIPPED_BEFORE_CLOSE = ()    # opcodes recv_close passes over before the close frame; none: it must come next

    def __init__(self, b, offer=None, timeout=HTTP_TIMEOUT):
        self.sock = socket.create_connection(("127.0.0.1", b.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16))
        extra = b"" if offer is None else b"Sec-WebSocket-Extensions: " + offer.encode() + b"\r\n"
        self.sock.sendall(b"GET /faye HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n%s\r\n" % (b.port, key, extra))
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            assert chunk, f"connection closed during the upgrade: {self.buffer!r}"
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0].startswith("HTTP/1.1 101"), lines[0]
        self.headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers.setdefault(k.strip().lower(), []).append(v.strip())
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        assert self.headers.get("sec-websocket-accept") == [accept], self.headers
        ext = self.headers.get("sec-websocket-extensions")
        assert ext is None or len(ext) == 1, ext
        self.extensions = ext[0] if ext else None

    @classmethod
    def frame(cls, opcode, payload=b"", fin=True, rsv=0, mask=None):
        """A client frame: `rsv` is or-ed into the first byte; masked with `mask` (the class's MASK by default)."""
        mask = cls.MASK if mask is None else mask
        n = len(payload)
        first = (0x80 if fin else 0) | rsv | opcode
        if n < 126:
            head = bytes([first, 0x80 | n])
        elif n < 1 << 16:
            head = bytes([first, 0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head = bytes([first, 0x80 | 127]) + n.to_bytes(8, "big")
        key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
        return head + mask + (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")

    def send(self, opcode, payload=b"", fin=True, rsv=0):
        self.sock.sendall(self.frame(opcode, payload, fin, rsv))

    def _read(self, n, deadline):
        while len(self.buffer) < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise AssertionError(f"nothing more from the server in time ({self.buffer[:200]!r} so far)") from None
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def recv_frame(self, timeout=HTTP_TIMEOUT):
        """The server's next Frame (fin, rsv, opcode, payload, size); None when the connection ended before one."""
        deadline = time.monotonic() + timeout
        head = self._read(2, deadline)
        if head is None:
            return None
        assert head[1] & 0x80 == 0, "a server frame is never masked"
        n = head[1] & 0x7F
        extended = b""
        if n == 126:
            extended = self._read(2, deadline)
            n = int.from_bytes(extended, "big")
        elif n == 127:
            extended = self._read(8, deadline)
            n = int.from_bytes(extended, "big")
        payload = self._read(n, deadline) if n else b""
        return Frame(bool(head[0] & 0x80), head[0] & 0x70, head[0] & 0x0F, payload, 2 + len(extended) + n)

    def recv_close(self, timeout=HTTP_TIMEOUT):
        """The body of the server's close frame, then the end of the connection. The close must be the next frame,
        but for frames whose opcodes are in SKIPPED_BEFORE_CLOSE."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self.recv_frame(max(0.01, deadline - time.monotonic()))
            assert frame is not None, "the connection ended without a close frame"
            if frame.opcode != CLOSE and frame.opcode in self.SKIPPED_BEFORE_CLOSE:
                continue
            assert (frame.fin, frame.rsv, frame.opcode) == (True, 0, CLOSE), (
                f"expected a close frame, got {frame[:3]}: {frame.payload[:200]!r}")
            self.assert_ends(timeout)
            return frame.payload

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


class EventStream:
    """A raw EventSource connection: GET <url>/<clientId> with Accept: text/event-stream.

    Faye writes the stream unframed (Connection: close); a chunked body is decoded too."""

    def __init__(self, b, cid, timeout=HTTP_TIMEOUT):
        self.sock = socket.create_connection(("127.0.0.1", b.port), timeout=timeout)
        req = (f"GET /faye/{cid} HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\n"
               f"Accept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n")
        self.sock.sendall(req.encode())
        self.raw = b""       # bytes as received after the head
        self.buf = b""       # decoded body not yet returned
        self.status = None
        self.headers = {}
        self.chunked = False
        self._read_head(timeout)

    def _recv(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("EventSource: nothing in time")
        self.sock.settimeout(remaining)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("EventSource stream closed")
        self.raw += chunk

    def _decode(self):
        if not self.chunked:
            self.buf += self.raw
            self.raw = b""
            return
        while True:
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                return
            size = int(self.raw[:line_end].split(b";")[0], 16)
            if len(self.raw) < line_end + 2 + size + 2:
                return
            self.buf += self.raw[line_end + 2:line_end + 2 + size]
            self.raw = self.raw[line_end + 2 + size + 2:]
            if size == 0:
                return

    def _read_head(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.raw:
            self._recv(deadline)
        head, _, self.raw = self.raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split(" ")[1])
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.chunked = self.headers.get("transfer-encoding", "").lower() == "chunked"
        self._decode()

    def next_block(self, timeout=HTTP_TIMEOUT):
        """Next event-stream block (text up to a blank line), without the terminator."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(rb"\r\n\r\n|\n\n|\r\r", self.buf)
            if m:
                block, self.buf = self.buf[:m.start()], self.buf[m.end():]
                return block.decode("utf-8")
            self._recv(deadline)
            self._decode()

    def close(self):
        self.sock.close()
