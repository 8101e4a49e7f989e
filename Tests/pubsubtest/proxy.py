"""A TCP proxy in front of a broker, to break a client's connection while its Bayeux session lives.

    with CuttingProxy(broker.port) as proxy:   # proxy.url, proxy.ws_url: the broker's endpoint through it
        proxy.stall()      # from now on what the broker sends is swallowed (written, never delivered)
        proxy.cut()        # every connection reset (RST) on both sides; new ones pass again
        proxy.cut(hold=True); ...; proxy.release()   # new ones are reset too until the release
        proxy.sent()       # every Bayeux message list the clients sent, in order: HTTP bodies (JSON, or a CORS
                           # form's `message=`) and WebSocket frames

One thread runs every connection with `select`, so a cut never races a half-forwarded buffer. Client frames are
whole and unfragmented (as clients send Bayeux), compressed or not.
"""

import json
import select
import socket
import struct
import threading
import urllib.parse
import zlib

from .ports import free_port


class _Pair:
    def __init__(self, client, server):
        self.client, self.server = client, server
        self.upstream = b""        # what the client sent, not parsed yet
        self.websocket = False


class CuttingProxy:
    def __init__(self, target_port, host="127.0.0.1", path="/faye"):
        self.target = (host, target_port)
        self.port = free_port()
        self.url = f"http://{host}:{self.port}{path}"
        self.ws_url = f"ws://{host}:{self.port}{path}"
        self._listener = socket.create_server((host, self.port))
        self._pairs = []
        self._lock = threading.Lock()
        self._sent = []
        self._cuts = 0
        self._stalled = False
        self._held = False
        self._cut_done = None
        self._running = True
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._running = False
        self._thread.join(5)
        self._listener.close()
        for pair in self._pairs:
            pair.client.close()
            pair.server.close()

    def stall(self):
        """Swallow what the broker sends from now on, until the next cut."""
        with self._lock:
            self._stalled = True

    def cut(self, hold=False):
        """Reset every connection (both sides), and let the next ones through (with `hold`, after `release()`).
        Returns once they are reset."""
        done = threading.Event()
        with self._lock:
            self._cuts += 1
            self._held = hold
            self._cut_done = done
        assert done.wait(5), "the proxy did not cut"

    def release(self):
        with self._lock:
            self._held = False

    def sent(self):
        """The message lists the clients sent, in the order they reached the proxy."""
        with self._lock:
            return list(self._sent)

    def _run(self):
        cuts = 0
        while self._running:
            with self._lock:
                cut, held = self._cuts != cuts, self._held
                if cut:
                    cuts, self._stalled, done = self._cuts, False, self._cut_done
            if cut:
                for pair in self._pairs:
                    _reset(pair.client)
                    _reset(pair.server)
                self._pairs = []
                done.set()
            sockets = [self._listener] + [s for p in self._pairs for s in (p.client, p.server)]
            readable, _, _ = select.select(sockets, [], [], 0.02)
            for s in readable:
                if s is self._listener:
                    client, _ = self._listener.accept()
                    if held:
                        _reset(client)
                    else:
                        self._pairs.append(_Pair(client, socket.create_connection(self.target)))
                    continue
                pair = next((p for p in self._pairs if s in (p.client, p.server)), None)
                if pair is None:
                    continue
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    pair.client.close()
                    pair.server.close()
                    self._pairs.remove(pair)
                elif s is pair.client:
                    pair.server.sendall(data)
                    pair.upstream += data
                    self._parse(pair)
                elif not self._is_stalled():
                    pair.client.sendall(data)

    def _is_stalled(self):
        with self._lock:
            return self._stalled

    def _parse(self, pair):
        """Takes the complete HTTP requests and WebSocket frames off `pair.upstream`, keeping their messages."""
        while True:
            if pair.websocket:
                frame = _ws_frame(pair.upstream)
                if frame is None:
                    return
                opcode, compressed, payload, size = frame
                pair.upstream = pair.upstream[size:]
                if opcode == 1:
                    # permessage-deflate without context takeover (the broker's terms): each message on its own.
                    self._keep(zlib.decompressobj(-15).decompress(payload + b"\0\0\xff\xff") if compressed else payload)
                continue
            end = pair.upstream.find(b"\r\n\r\n")
            if end < 0:
                return
            head = pair.upstream[:end].decode("latin-1").lower()
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip() == "content-length":
                    length = int(value.strip())
            if len(pair.upstream) < end + 4 + length:
                return
            body = pair.upstream[end + 4:end + 4 + length]
            pair.upstream = pair.upstream[end + 4 + length:]
            if "upgrade: websocket" in head:
                pair.websocket = True
            elif body:
                self._keep(body)

    def _keep(self, body):
        if body.startswith(b"message="):      # a CORS request's form body
            body = urllib.parse.unquote_plus(body[len(b"message="):].decode())
        try:
            messages = json.loads(body)
        except ValueError:
            return
        with self._lock:
            self._sent.append(messages if isinstance(messages, list) else [messages])


def _reset(sock):
    """Close with an RST, as a connection that dies on the way does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


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
