"""permessage-deflate (RFC 7692) for the suites that test WebSocket compression (Tests/wire, Tests/interop,
Tests/hostile, Tests/browser): a job-progress event of a given size, DEFLATE as a permessage-deflate peer makes and
reads it with Python's zlib, and a Bayeux client over Python's `websockets` library (which negotiates
compression unless told `compression=None`).
"""

import json
import time
import zlib

from websockets.sync.client import connect as ws_connect

# The broker's one answer to an offer it accepts.
ANSWER = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
# What a sync flush ends with, removed from each message on the wire (RFC 7692 section 7.2.1).
TAIL = b"\x00\x00\xff\xff"


def job_progress(size=1024, job="render-42", step=7):
    """A job-progress event of at least `size` bytes of JSON, shaped like what a job runner reports: repeated keys,
    numbers that change, log lines that are alike but not equal (compressible as real ones are, not trivially)."""
    data = {"job": job, "state": "running", "step": step, "of": 40, "percent": round(step / 40 * 100, 1),
            "started_at": "2026-11-28T01:51:07.118Z", "worker": "worker-3.eu-west.internal", "log": []}
    i = 0
    while len(json.dumps(data)) < size:
        data["log"].append({"t": 1764294667 + i * 13, "level": "info" if i % 5 else "debug",
                            "line": f"frame {i * 17 + step} encoded in {(i * 7919) % 1000 / 10:.1f} ms "
                                    f"({(i * 104729) % 90 + 10} KiB, q={i % 4 + 1})"})
        i += 1
    return data


def deflate_alone(text_bytes):
    """What zlib gives for this one message, as permessage-deflate sends it: raw DEFLATE, sync-flushed, the final
    00 00 ff ff removed."""
    c = zlib.compressobj(wbits=-15)
    out = c.compress(text_bytes) + c.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(TAIL)
    return out[:-4]


def inflate(payload):
    return zlib.decompressobj(-15).decompress(payload + TAIL)


def flat(frame_json):
    """A frame's Bayeux messages: the server sends arrays, and may send one event as a single object."""
    value = json.loads(frame_json)
    return value if isinstance(value, list) else [value]


class WebSocketSession:
    """A Bayeux client over a `websockets` connection: handshake, connect, subscribe; keeps a /meta/connect
    outstanding; collects every message it receives. Not BayeuxWebSocket: `websocket-client` cannot offer or
    speak permessage-deflate, and a second, independent implementation negotiating it is the point here."""

    def __init__(self, b, compression="deflate", timeout=10):
        self.ws = ws_connect(b.ws_url, compression=compression, open_timeout=timeout,
                             max_size=1 << 24).__enter__()
        self.messages = []
        self.ws.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                  "supportedConnectionTypes": ["websocket"], "id": "hs"}]))
        hs = self.wait(lambda m: m.get("channel") == "/meta/handshake")
        assert hs["successful"] is True, hs
        self.cid = hs["clientId"]
        self._connect()

    @property
    def offered(self):
        return self.ws.request.headers.get_all("Sec-WebSocket-Extensions")

    @property
    def answered(self):
        return self.ws.response.headers.get_all("Sec-WebSocket-Extensions")

    @property
    def extensions(self):
        return [e.name for e in self.ws.protocol.extensions]

    def _connect(self):
        self.ws.send(json.dumps([{"channel": "/meta/connect", "clientId": self.cid, "connectionType": "websocket"}]))

    def send(self, messages):
        self.ws.send(json.dumps(messages))

    def subscribe(self, channel):
        self.send([{"channel": "/meta/subscribe", "clientId": self.cid, "subscription": channel, "id": "s"}])
        reply = self.wait(lambda m: m.get("channel") == "/meta/subscribe" and m.get("subscription") == channel)
        assert reply["successful"] is True, reply

    def wait(self, predicate, timeout=10, what=None):
        """The first message (received from now on, or already received and not yet taken) that matches."""
        deadline = time.monotonic() + timeout
        while True:
            for i, m in enumerate(self.messages):
                if predicate(m):
                    return self.messages.pop(i)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what or 'matching message'} within {timeout}s; got {self.messages}")
            try:
                raw = self.ws.recv(timeout=remaining)
            except TimeoutError:
                continue
            for m in flat(raw):
                if m.get("channel") == "/meta/connect" and m.get("successful") is True:
                    self._connect()
                self.messages.append(m)

    def event(self, channel, timeout=10):
        return self.wait(lambda m: m.get("channel") == channel and "data" in m and "successful" not in m, timeout,
                         f"event on {channel}")

    def close(self):
        self.ws.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
