"""A TCP proxy on a loopback port that the tests break on purpose (standard library only): between clients and a
broker, or a broker and Redis.

    with FaultProxy(("127.0.0.1", broker.port)) as proxy:   # listens on proxy.port, forwards to the target
        proxy.url, proxy.ws_url   # the broker's endpoint (/faye) through the proxy
        proxy.stall(2)       # the client side sees nothing for 2 s: nothing is read from the target (its writes
                             # pile up in the kernel's buffers) nor written to the client; both=True also stops
                             # reading what the client sends; no `seconds`: until heal() or a reset
        proxy.reset()        # every current connection closed with RST (SO_LINGER 0), on both sides
        proxy.reset(hold=True)   # ... and every new one too, at once, until heal(): the broker is unreachable
        proxy.blackhole()    # bytes swallowed both ways, sockets kept open (new connections too), until heal()
        proxy.drop()         # every current connection closed without RST (a FIN, no close frame)
        proxy.heal()         # ends a stall, the blackhole and a held reset
        proxy.counters()     # accepted, active, bytes each way, swallowed, resets, drops, ...
        proxy.sent()         # with record=True, every Bayeux message list the clients sent, in order: HTTP bodies
                             # (JSON, or a CORS form's `message=`) and WebSocket frames (compressed or not)

One thread owns every socket (non-blocking, select()); the methods above are carried out by that thread and return
once they took effect. A stall or a blackhole applies to the connections open when it is called (a blackhole also
to those accepted while it lasts); connections keep being accepted after any fault. A half-close is passed on
(the other side gets a FIN once what was read is written); an error on one side resets the other.
"""

import collections
import json
import queue
import select
import socket
import struct
import threading
import time
import urllib.parse
import zlib

from .ports import free_port

CHUNK = 65536
BUFFER_LIMIT = 65536  # bytes the proxy holds per direction before it stops reading that side
LINGER_RST = struct.pack("ii", 1, 0)


class _Conn:
    __slots__ = ("id", "client", "upstream", "down", "up", "stalled_down", "stalled_up", "blackholed",
                 "client_eof", "upstream_eof", "client_shut", "upstream_shut", "stall_until", "recorder")

    def __init__(self, cid, client, upstream, blackholed, record):
        self.id = cid
        self.client = client
        self.upstream = upstream
        self.down = bytearray()  # target -> client, read and not yet written
        self.up = bytearray()    # client -> target
        self.stalled_down = False
        self.stalled_up = False
        self.stall_until = None
        self.blackholed = blackholed
        self.client_eof = self.upstream_eof = False
        self.client_shut = self.upstream_shut = False
        self.recorder = _Recorder() if record else None


class FaultProxy:
    """See the module's docstring. `target` is (host, port); `name` shows in errors; `path` is the endpoint that
    `url` and `ws_url` name; `record` keeps what the clients send as Bayeux message lists (sent())."""

    def __init__(self, target, name="proxy", path="/faye", record=False):
        self.target = tuple(target)
        self.record = record
        self.name = name
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port), backlog=128)
        self.listener.setblocking(False)
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self.ws_url = f"ws://127.0.0.1:{self.port}{path}"
        self.conns = []
        self.blackholing = False
        self.holding = False
        self._sent = []
        self.count = collections.Counter()
        self._ids = 0
        self._commands = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"faultproxy-{self.port}", daemon=True)
        self._thread.start()

    # -- the test's side -----------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _do(self, fn, timeout=5.0):
        """Runs `fn()` on the proxy's thread and returns its result once done."""
        if threading.current_thread() is self._thread:
            return fn()
        done = threading.Event()
        box = {}

        def command():
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001  (handed to the caller)
                box["error"] = e
            done.set()

        self._commands.put(command)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if not done.wait(timeout):
            raise RuntimeError(f"{self.name}: the proxy thread did not answer within {timeout}s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def stall(self, seconds=None, both=False):
        """The connections open now stop passing the target's bytes to the client (and, with both=True, the
        client's to the target) for `seconds` (None: until heal()). Returns how many connections were stalled."""
        def apply():
            until = None if seconds is None else time.monotonic() + seconds
            for c in self.conns:
                c.stalled_down = True
                c.stalled_up = c.stalled_up or both
                c.stall_until = until
            self.count["stalls"] += 1
            return len(self.conns)
        return self._do(apply)

    def blackhole(self):
        """Every byte read from either side, on the open connections and on those accepted until heal(), is
        thrown away; the sockets stay open. Returns how many connections were open."""
        def apply():
            self.blackholing = True
            for c in self.conns:
                c.blackholed = True
                c.down.clear()
                c.up.clear()
            self.count["blackholes"] += 1
            return len(self.conns)
        return self._do(apply)

    def heal(self):
        """Ends every stall, the blackhole and a held reset (connections blackholed stay so: what they lost breaks
        their streams; a drop() or reset() ends them)."""
        def apply():
            self.blackholing = False
            self.holding = False
            for c in self.conns:
                c.stalled_down = c.stalled_up = False
                c.stall_until = None
        return self._do(apply)

    def reset(self, hold=False):
        """Closes every current connection with RST on both sides; with `hold`, every connection accepted until
        heal() too, at once (the client sees its connect refused by a reset). Returns how many there were."""
        def apply():
            self.holding = hold
            n = len(self.conns)
            for c in list(self.conns):
                self._close(c, rst=True)
            self.count["resets"] += n
            return n
        return self._do(apply)

    def drop(self):
        """Closes every current connection without RST (what was received and not read is read first, so that
        the kernel sends a FIN). Returns how many there were."""
        def apply():
            n = len(self.conns)
            for c in list(self.conns):
                self._close(c, rst=False)
            self.count["drops"] += n
            return n
        return self._do(apply)

    def sent(self):
        """The message lists the clients sent, in the order the proxy read them (record=True)."""
        assert self.record, "a FaultProxy(record=True) keeps what its clients send"
        return self._do(lambda: list(self._sent))

    def counters(self):
        """accepted, active, bytes_up, bytes_down, swallowed, stalls, blackholes, resets, drops,
        connect_failures, closed, errors."""
        def read():
            figures = dict(self.count)
            figures["active"] = len(self.conns)
            return figures
        return self._do(read)

    def close(self):
        if self._stopping:
            return
        try:
            self.reset()
        except RuntimeError:
            pass
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5)
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()

    # -- the proxy's thread --------------------------------------------

    def _close(self, c, rst):
        if c in self.conns:
            self.conns.remove(c)
        for s in (c.client, c.upstream):
            if s is None:
                continue
            try:
                if rst:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
                else:
                    while s.recv(CHUNK):  # unread data would make the kernel answer with RST
                        pass
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
        self.count["closed"] += 1

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self.count["accepted"] += 1
            if self.holding:
                self.count["refused"] += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                self.count["connect_failures"] += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
                client.close()
                continue
            for s in (client, upstream):
                s.setblocking(False)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._ids += 1
            self.conns.append(_Conn(self._ids, client, upstream, self.blackholing, self.record))

    def _run(self):
        while not self._stopping:
            while True:
                try:
                    self._commands.get_nowait()()
                except queue.Empty:
                    break
            now = time.monotonic()
            readers, writers = [self.listener, self._wake_r], []
            for c in self.conns:
                if c.stall_until is not None and now >= c.stall_until:
                    c.stalled_down = c.stalled_up = False
                    c.stall_until = None
                if not c.stalled_up and not c.client_eof and len(c.up) < BUFFER_LIMIT:
                    readers.append(c.client)
                if not c.stalled_down and not c.upstream_eof and len(c.down) < BUFFER_LIMIT:
                    readers.append(c.upstream)
                if c.down and not c.stalled_down:
                    writers.append(c.client)
                if c.up and not c.stalled_up:
                    writers.append(c.upstream)
            try:
                readable, writable, _ = select.select(readers, writers, [], 0.05)
            except (OSError, ValueError):
                continue  # a socket closed under us; the next round builds the lists again
            readable, writable = set(readable), set(writable)
            if self._wake_r in readable:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
            if self.listener in readable:
                self._accept()
            for c in list(self.conns):
                self._pump(c, readable, writable)

    def _pump(self, c, readable, writable):
        try:
            if c.client in readable:
                data = c.client.recv(CHUNK)
                if not data:
                    c.client_eof = True
                elif c.blackholed:
                    self.count["swallowed"] += len(data)
                else:
                    c.up += data
                    if c.recorder is not None:
                        self._sent += c.recorder.feed(data)
            if c.upstream in readable:
                data = c.upstream.recv(CHUNK)
                if not data:
                    c.upstream_eof = True
                elif c.blackholed:
                    self.count["swallowed"] += len(data)
                else:
                    c.down += data
            if c.client in writable and c.down:
                n = c.client.send(c.down)
                del c.down[:n]
                self.count["bytes_down"] += n
            if c.upstream in writable and c.up:
                n = c.upstream.send(c.up)
                del c.up[:n]
                self.count["bytes_up"] += n
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            # A reset (or any error) on one side: the other side is reset too, as a broken path would.
            self.count["errors"] += 1
            self._close(c, rst=True)
            return
        # Half-closes passed on once what was read has been written.
        if c.client_eof and not c.up and not c.upstream_shut:
            c.upstream_shut = True
            try:
                c.upstream.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        if c.upstream_eof and not c.down and not c.client_shut:
            c.client_shut = True
            try:
                c.client.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        if c.client_shut and c.upstream_shut:
            self._close(c, rst=False)


class _Recorder:
    """The Bayeux message lists in what one client sent: whole HTTP requests' bodies, then, after an upgrade,
    its WebSocket text frames (whole and unfragmented, as clients send Bayeux; inflated when compressed)."""

    def __init__(self):
        self.pending = b""
        self.websocket = False

    def feed(self, data):
        self.pending += data
        found = []
        while True:
            if self.websocket:
                frame = _ws_frame(self.pending)
                if frame is None:
                    return found
                opcode, compressed, payload, size = frame
                self.pending = self.pending[size:]
                if opcode == 1:
                    # permessage-deflate without context takeover (the broker's terms): each message on its own.
                    found += _messages(zlib.decompressobj(-15).decompress(payload + b"\0\0\xff\xff")
                                       if compressed else payload)
                continue
            end = self.pending.find(b"\r\n\r\n")
            if end < 0:
                return found
            head = self.pending[:end].decode("latin-1").lower()
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip() == "content-length":
                    length = int(value.strip())
            if len(self.pending) < end + 4 + length:
                return found
            body = self.pending[end + 4:end + 4 + length]
            self.pending = self.pending[end + 4 + length:]
            if "upgrade: websocket" in head:
                self.websocket = True
            elif body:
                found += _messages(body)


def _messages(body):
    """[the message list] in one request body or frame (a CORS form's `message=` too); [] when it is not JSON."""
    if body.startswith(b"message="):
        body = urllib.parse.unquote_plus(body[len(b"message="):].decode())
    try:
        messages = json.loads(body)
    except ValueError:
        return []
    return [messages if isinstance(messages, list) else [messages]]


def _ws_frame(data):
    """(opcode, compressed, unmasked payload, frame size) of the first whole frame a client sent, or None."""
    if len(data) < 2:
        return None
    opcode, compressed, length, offset = data[0] & 0x0F, bool(data[0] & 0x40), data[1] & 0x7F, 2
    if length == 126:
        if len(data) < 4:
            return None
        length, offset = struct.unpack("!H", data[2:4])[0], 4
    elif length == 127:
        if len(data) < 10:
            return None
        length, offset = struct.unpack("!Q", data[2:10])[0], 10
    masked = data[1] & 0x80
    mask = data[offset:offset + 4] if masked else b"\0\0\0\0"
    offset += 4 if masked else 0
    if len(data) < offset + length:
        return None
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(data[offset:offset + length]))
    return opcode, compressed, payload, offset + length
