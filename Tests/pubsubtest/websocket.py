"""WebSocket for the suites: one Bayeux client, and one raw WebSocket.

BayeuxWebSocket is a well-behaved Bayeux client over the `websocket-client` library: it sends message lists and
reads replies and events as they come (`recv` one frame, `read` until a condition, `wait_for` one message).
BayeuxListener is the same client read by a thread of its own, for the tests that send while events arrive: it
files replies by id and events in order, and keeps its /meta/connect going (`listen`, `request`, `wait_events`).

The raw WebSocket (RFC 6455 byte for byte) is for the tests that speak the protocol itself (bad frames, RSV bits,
fragments, compression, upgrades cut short, sockets that never read): the upgrade request, client frames, and
RawWebSocket, an upgraded socket that sends frames as the test writes them and reads the server's as they are."""

import base64
import collections
import hashlib
import json
import os
import socket
import threading
import time

import websocket

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
RSV1, RSV2, RSV3 = 0x40, 0x20, 0x10
MASK = b"\x37\xfa\x21\x3d"
TIMEOUT = 10



class BayeuxWebSocket:
    """A Bayeux client over one WebSocket to `target` (a Broker, or a ws:// URL), optionally bound to a client id
    `cid` (which may come from another node). Messages read are kept in `pending`, in the order they came.
    Keywords go to websocket.create_connection (header, origin, sslopt...). Used in a `with` block, it is closed
    at the block's end."""

    def __init__(self, target, cid=None, timeout=TIMEOUT, **kw):
        url = target if isinstance(target, str) else target.ws_url
        self.sock = websocket.create_connection(url, timeout=timeout, **kw)
        self.cid = cid
        self.pending = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def send(self, messages):
        """Sends `messages` (a message list) as JSON; text is sent as it is."""
        self.sock.send(messages if isinstance(messages, str) else json.dumps(messages))

    def recv(self, timeout=TIMEOUT):
        """The next text frame's messages (parsed JSON), not kept in `pending`; raises
        websocket.WebSocketTimeoutException when none comes within `timeout`."""
        self.sock.settimeout(timeout)
        opcode, data = self.sock.recv_data()
        assert opcode == websocket.ABNF.OPCODE_TEXT, (opcode, data)
        return json.loads(data.decode("utf-8"))

    def read(self, until, timeout=TIMEOUT):
        """Reads frames until `until(pending)` is true or `timeout` seconds have passed; returns `pending`."""
        deadline = time.monotonic() + timeout
        while not until(self.pending) and time.monotonic() < deadline:
            try:
                self.pending.extend(self.recv(max(0.05, deadline - time.monotonic())))
            except websocket.WebSocketTimeoutException:
                break
        return self.pending

    def wait_for(self, channel, timeout=TIMEOUT, event=False):
        """Takes from `pending` the first message on `channel` (with `event`, the first carrying data, not a
        publish's reply), reading until it comes; fails after `timeout` seconds."""
        def find(ms):
            return next((i for i, m in enumerate(ms) if m.get("channel") == channel and (not event or "data" in m)),
                        None)

        self.read(lambda ms: find(ms) is not None, timeout)
        i = find(self.pending)
        assert i is not None, f"nothing on {channel} within {timeout} s (have {self.pending})"
        return self.pending.pop(i)

    def recv_close(self, timeout=TIMEOUT):
        """Reads until the server's close frame and returns its status code (1005 when it has none), or None when
        the connection ended without one; the messages of the text frames read on the way go to `pending`.
        Fails when nothing ends the connection within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                frame = self.sock.recv_frame()
            except websocket.WebSocketTimeoutException:
                raise AssertionError(f"no close frame within {timeout} s (have {self.pending})") from None
            except (websocket.WebSocketConnectionClosedException, ConnectionResetError, BrokenPipeError):
                return None
            if frame is None:
                return None
            if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
                return int.from_bytes(frame.data[:2], "big") if len(frame.data) >= 2 else 1005
            if frame.opcode == websocket.ABNF.OPCODE_TEXT:
                self.pending.extend(json.loads(frame.data.decode("utf-8")))

    def events(self):
        """The messages read that are not /meta/ replies."""
        return [m for m in self.pending if not m.get("channel", "").startswith("/meta/")]

    def handshake(self, types=("websocket",)):
        """A /meta/handshake over this socket; binds and returns the client id."""
        self.send([{"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": list(types)}])
        reply = self.wait_for("/meta/handshake")
        assert reply["successful"] is True, reply
        self.cid = reply["clientId"]
        return self.cid

    def subscribe(self, subscription):
        """A /meta/subscribe over this socket; returns the reply, asserted successful."""
        self.send([{"channel": "/meta/subscribe", "clientId": self.cid, "subscription": subscription}])
        reply = self.wait_for("/meta/subscribe")
        assert reply["successful"] is True, reply
        return reply

    def connect(self, advice_timeout=0):
        """Sends a /meta/connect (answered at once by default: advice.timeout 0); its reply is read later."""
        self.send([{"channel": "/meta/connect", "clientId": self.cid, "connectionType": "websocket",
                    "advice": {"timeout": advice_timeout}}])

    def close(self):
        try:
            self.sock.close(timeout=1)
        except Exception:
            pass


class BayeuxListener(BayeuxWebSocket):
    """A BayeuxWebSocket read by a thread of its own once `listen()` is called (handshake first, over the plain
    client). Every message read is filed under `cond`: a reply (it has `successful`) in `replies` by its id, anything
    else in `events` (a list here, not the plain client's method), in order; `frames` counts the frames read,
    `failures` lists the connects refused and how the socket ended if the test did not close it. With renew=True,
    `listen()` sends a /meta/connect and every successful /meta/connect reply is answered with the next one, as a
    client that stays connected does; renew=False leaves the connects to the test."""

    def __init__(self, target, cid=None, timeout=TIMEOUT, renew=True, **kw):
        super().__init__(target, cid, timeout, **kw)
        self.renew = renew
        self.cond = threading.Condition()
        self.replies = {}      # json.dumps(id) -> the replies with that id, in order
        self.events = []
        self.frames = 0
        self.failures = []
        self._ids = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def listen(self):
        """Starts the reader (and with renew=True the /meta/connect loop); returns self."""
        self._thread.start()
        if self.renew:
            self._send_connect()
        return self

    def new_id(self):
        self._ids += 1
        return f"l{self._ids}"

    def _send_connect(self):
        try:
            self.send([{"channel": "/meta/connect", "clientId": self.cid, "connectionType": "websocket",
                        "id": self.new_id()}])
        except Exception as e:  # noqa: BLE001  (the socket ended: the reader says so)
            self.failures.append(f"connect not sent: {e!r}")

    def _read(self):
        self.sock.settimeout(0.25)
        while not self._closed.is_set():
            try:
                opcode, data = self.sock.recv_data()   # answers pings on the way
            except websocket.WebSocketTimeoutException:
                continue
            except Exception as e:  # noqa: BLE001  (closed, reset: no longer served)
                if not self._closed.is_set():
                    self.failures.append(f"socket ended: {e!r}")
                break
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                self.failures.append(f"closed by the broker: {data!r}")
                break
            try:
                parsed = json.loads(data)
            except ValueError:
                self.failures.append(f"not JSON: {data[:100]!r}")
                continue
            renew = False
            with self.cond:
                self.frames += 1
                for m in parsed if isinstance(parsed, list) else [parsed]:
                    if "successful" in m:
                        self.replies.setdefault(json.dumps(m.get("id")), []).append(m)
                        if m.get("channel") == "/meta/connect":
                            renew |= m["successful"] is True
                            if m["successful"] is not True:
                                self.failures.append(f"connect failed: {m}")
                    else:
                        self.events.append(m)
                self.cond.notify_all()
            if renew and self.renew:
                self._send_connect()
        with self.cond:
            self._closed.set()
            self.cond.notify_all()

    def _wait(self, ready, timeout, what):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = ready()
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                have = f"replies {self.replies}, events {self.events}, failures {self.failures}"
                assert remaining > 0, f"no {what} within {timeout} s ({have})"
                if self._closed.is_set():
                    raise AssertionError(f"the socket ended while waiting for {what} ({have})")
                self.cond.wait(remaining)

    def reply(self, id, timeout=TIMEOUT):
        """The first reply with `id`, once it came."""
        key = json.dumps(id)
        return self._wait(lambda: self.replies[key][0] if key in self.replies else None, timeout,
                          f"reply with id {id!r}")

    def request(self, message, timeout=TIMEOUT):
        """Sends one message (with an id of its own unless it has one) and returns its reply."""
        message = dict(message)
        message.setdefault("id", self.new_id())
        self.send([message])
        return self.reply(message["id"], timeout)

    def subscribe(self, subscription, ext=None, timeout=TIMEOUT):
        """A /meta/subscribe (with `ext` when given); returns the reply, whether successful or not."""
        m = {"channel": "/meta/subscribe", "clientId": self.cid, "subscription": subscription}
        if ext is not None:
            m["ext"] = ext
        return self.request(m, timeout)

    def wait_events(self, n, timeout=TIMEOUT):
        """All the events, once there are at least `n`."""
        return self._wait(lambda: list(self.events) if len(self.events) >= n else None, timeout, f"{n} events")

    def wait_event(self, predicate, timeout=TIMEOUT, what="event"):
        """The first event for which `predicate` is true, once it came."""
        return self._wait(lambda: next((m for m in self.events if predicate(m)), None), timeout, what)

    def ended(self):
        """Whether the socket ended (or was closed)."""
        return self._closed.is_set()

    def close(self):
        self._closed.set()
        super().close()
        if self._thread.is_alive():
            self._thread.join(timeout=2)


# A server frame: `rsv` holds the RSV bits in place (RSV1 is 0x40), `size` is the frame's bytes on the wire.
Frame = collections.namedtuple("Frame", "fin rsv opcode payload size")


def new_key() -> str:
    """A Sec-WebSocket-Key: 16 random bytes in base64."""
    return base64.b64encode(os.urandom(16)).decode()


def accept_for(key) -> str:
    """The Sec-WebSocket-Accept a server answers to `key`."""
    key = key.encode() if isinstance(key, str) else key
    return base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()


def upgrade_headers(key=None, offer=None) -> str:
    """The header lines of an upgrade request (each ending in CRLF, without the blank line): `key` (a fresh one by
    default), and a Sec-WebSocket-Extensions offer when `offer` is given."""
    lines = ("Upgrade: websocket\r\nConnection: Upgrade\r\n"
             f"Sec-WebSocket-Key: {key or new_key()}\r\nSec-WebSocket-Version: 13\r\n")
    if offer is not None:
        lines += f"Sec-WebSocket-Extensions: {offer}\r\n"
    return lines


def upgrade_request(port, path="/faye", key=None, offer=None, host=None) -> bytes:
    """A whole upgrade request for `path` on the broker at `port` (Host 127.0.0.1:port unless `host`)."""
    host = host or f"127.0.0.1:{port}"
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{upgrade_headers(key, offer)}\r\n".encode()


def frame(opcode, payload=b"", fin=True, rsv=0, mask=MASK) -> bytes:
    """A client frame: `rsv` is or-ed into the first byte; the payload (bytes or str) masked with `mask`."""
    if isinstance(payload, str):
        payload = payload.encode()
    n = len(payload)
    first = (0x80 if fin else 0) | rsv | opcode
    if n < 126:
        head = bytes([first, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([first, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([first, 0x80 | 127]) + n.to_bytes(8, "big")
    if mask == b"\0\0\0\0":  # a valid key that leaves the payload as it is
        return head + mask + payload
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return head + mask + (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")


class RawWebSocket:
    """An upgraded TCP socket, with an optional `Sec-WebSocket-Extensions` offer, that sends masked frames as the
    test writes them (any opcode, RSV bits, fragments) and reads the server's unmasked ones with their RSV bits.
    `b` is a broker (its `port`). Used in a `with` block, it is closed at the block's end.

    `extensions` is the server's one Sec-WebSocket-Extensions answer, None without one; `headers` maps each
    lower-cased response header to its values."""

    MASK = MASK
    SKIPPED_BEFORE_CLOSE = ()    # opcodes recv_close passes over before the close frame; none: it must come next

    def __init__(self, b, offer=None, timeout=TIMEOUT):
        self.sock = socket.create_connection(("127.0.0.1", b.port), timeout=timeout)
        key = new_key()
        self.sock.sendall(upgrade_request(b.port, key=key, offer=offer))
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
        assert self.headers.get("sec-websocket-accept") == [accept_for(key)], self.headers
        ext = self.headers.get("sec-websocket-extensions")
        assert ext is None or len(ext) == 1, ext
        self.extensions = ext[0] if ext else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @classmethod
    def frame(cls, opcode, payload=b"", fin=True, rsv=0, mask=None):
        """A client frame: `rsv` is or-ed into the first byte; masked with `mask` (the class's MASK by default)."""
        return frame(opcode, payload, fin, rsv, cls.MASK if mask is None else mask)

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

    def recv_frame(self, timeout=TIMEOUT):
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

    def recv_close(self, timeout=TIMEOUT):
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

    def recv_close_code(self, timeout=TIMEOUT):
        payload = self.recv_close(timeout)
        assert len(payload) >= 2, f"a close frame without a status code: {payload!r}"
        return int.from_bytes(payload[:2], "big")

    def assert_ends(self, timeout=TIMEOUT):
        """The server closes the TCP connection (after its close frame, nothing more)."""
        frame = self.recv_frame(timeout)
        assert frame is None, f"a frame after the close: {frame!r}"

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
