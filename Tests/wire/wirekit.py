"""Wire helpers: servers, HTTP, WebSocket, raw socket and EventSource clients for the Bayeux suites.

Run against the Swift server:   pytest Tests/wire
Run against real Faye 1.4.0:    PUBSUB_TARGET=faye pytest Tests/wire
"""

import json
import re
import socket
import time

import pytest
import requests
import websocket

from pubsubtest.broker import Broker, target
# The raw WebSocket (RFC 6455 byte for byte), its frames and opcodes: named here for the wire suites.
from pubsubtest.websocket import (BINARY, CLOSE, CONT, GUID, PING, PONG, RSV1, RSV2, RSV3, TEXT,  # noqa: F401
                                  BayeuxWebSocket, Frame, RawWebSocket)

# ---------------------------------------------------------------- constants

ALL6 = ["long-polling", "cross-origin-long-polling", "callback-polling",
        "websocket", "eventsource", "in-process"]

CLIENT_ID_RE = re.compile(r"^[0-9a-z]{15}$")

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

class WS(BayeuxWebSocket):
    """The suites' Bayeux WebSocket client (pubsubtest.websocket), its replies read without pubsub's positions (to
    compare them with Faye's), with the wire suites' checks: other opcodes, quiet (the close frame: recv_close)."""

    def __init__(self, b, timeout=HTTP_TIMEOUT, **kw):
        super().__init__(b, timeout=timeout, **kw)

    def send_bytes(self, data, opcode=websocket.ABNF.OPCODE_BINARY):
        self.sock.send(data, opcode=opcode)

    def recv(self, timeout=HTTP_TIMEOUT):
        """Next text frame as parsed JSON; raises websocket.WebSocketTimeoutException on timeout."""
        return without_positions(super().recv(timeout))

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

    def handshake(self, id="wh"):
        """A handshake whose reply must be the next frame, alone; returns the client id."""
        self.send([handshake_msg(id, ("websocket",))])
        reply = self.recv()
        assert len(reply) == 1 and reply[0]["successful"] is True, reply
        self.cid = reply[0]["clientId"]
        return self.cid


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
