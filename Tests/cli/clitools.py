"""Helpers of the CLI suite: run the pubsub binary, and watch a broker over a raw WebSocket."""

import hashlib
import hmac
import json
import os
import subprocess
import threading
import time

import websocket

from pubsubtest.broker import Broker, pubsub_bin  # noqa: F401  (re-exported for the test modules)
from pubsubtest.ports import closed_port  # noqa: F401  (re-exported for the test modules)

SECRET = "secret"
RUN_TIMEOUT = 30     # no CLI run of this suite may take longer
QUIET = 1.0          # seconds watched for "nothing arrives"


def clean_env(**extra):
    """The test's environment without PUBSUB_* (so a developer's settings cannot leak in), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PUBSUB_") and k not in ("RAILS_ENV", "RACK_ENV")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(args, *, input=None, env=None, timeout=RUN_TIMEOUT):
    """Run `pubsub ARGS...`; returns CompletedProcess with text stdout/stderr and `elapsed`."""
    t0 = time.monotonic()
    p = subprocess.run([pubsub_bin()] + list(args), input=input, capture_output=True, text=True,
                       env=env if env is not None else clean_env(), timeout=timeout)
    p.elapsed = time.monotonic() - t0
    return p


def now_ms():
    return int(round(time.time() * 1000))


def sha1_sign(channel, ts, secret=SECRET):
    return hashlib.sha1(f"{secret}{channel}{ts}".encode()).hexdigest()


def hmac_sign(channel, ts, client_id="", secret=SECRET):
    text = f"subscribe\n{channel}\n{ts}\n{client_id}"
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def signed_ext(channel, secret=SECRET, ts=None):
    ts = now_ms() if ts is None else ts
    return {"private_pub_signature": sha1_sign(channel, ts, secret), "private_pub_timestamp": ts}


class Listener:
    """A raw Bayeux client over WebSocket that records every event it is sent.

    `subscribe` returns the server's reply; events are collected by a reader thread; connects are renewed as
    their replies arrive, so events keep flowing however the broker batches them."""

    def __init__(self, broker, timeout=10):
        self.sock = websocket.create_connection(broker.ws_url, timeout=timeout)
        self.events = []
        self.replies = []
        self._lock = threading.Condition()
        self._next = 0
        self._closed = False
        self.sock.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                    "supportedConnectionTypes": ["websocket"], "id": "h"}]))
        reply = json.loads(self.sock.recv())
        assert reply[0]["successful"] is True, reply
        self.client_id = reply[0]["clientId"]
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._send_connect()

    def _id(self):
        self._next += 1
        return f"l{self._next}"

    def _send_connect(self):
        try:
            self.sock.send(json.dumps([{"channel": "/meta/connect", "clientId": self.client_id,
                                        "connectionType": "websocket", "id": self._id()}]))
        except Exception:
            pass

    def _read(self):
        while not self._closed:
            try:
                self.sock.settimeout(0.5)
                data = self.sock.recv()
            except websocket.WebSocketTimeoutException:
                continue
            except Exception:
                return
            if not data:
                continue
            for m in json.loads(data):
                with self._lock:
                    if m.get("channel") == "/meta/connect":
                        if m.get("successful"):
                            self._send_connect()
                    elif "successful" in m:
                        self.replies.append(m)
                    else:
                        self.events.append(m)
                    self._lock.notify_all()

    def request(self, message, timeout=10):
        """Send one message (an id is added) and wait for its reply."""
        message = dict(message, id=self._id())
        self.sock.send(json.dumps([message]))
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for r in self.replies:
                    if r.get("id") == message["id"]:
                        return r
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no reply to {message}"
                self._lock.wait(remaining)

    def subscribe(self, channel, ext=None):
        m = {"channel": "/meta/subscribe", "clientId": self.client_id, "subscription": channel}
        if ext is not None:
            m["ext"] = ext
        return self.request(m)

    def wait_events(self, n, timeout=10):
        """Wait until at least n events arrived; returns them all."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.events) < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"expected {n} events, got {len(self.events)}: {self.events}")
                self._lock.wait(remaining)
            return list(self.events)

    def assert_quiet(self, seconds=QUIET, count=0):
        """Watch for `seconds`: no events beyond the first `count` arrive."""
        time.sleep(seconds)
        with self._lock:
            assert len(self.events) == count, self.events

    def close(self):
        self._closed = True
        try:
            self.sock.close(timeout=1)
        except Exception:
            pass
        self._reader.join(timeout=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
