"""A webhook receiver (Python's http.server in a thread), a small long-polling Bayeux client and a broker started
with webhook flags, for the webhook suite. Names are unique to this suite (pytest shares modules across folders)."""

import datetime
import hashlib
import hmac
import json
import threading
import time
import urllib.request
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pubsubtest.bayeux import bayeux, handshake, subscribe
from pubsubtest.broker import Broker
from pubsubtest.ports import free_port as hook_free_port  # noqa: F401  (re-exported for the test modules)
from pubsubtest.wait import wait_until

HOOK_SECRET = "hook-secret-7f3a"


class HookPost:
    def __init__(self, headers, body: bytes, at: float):
        self.headers = headers
        self.body = body
        self.at = at
        self.events = json.loads(body)["events"]

    def signature_ok(self, secret=HOOK_SECRET) -> bool:
        expected = "sha256=" + hmac.new(secret.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, self.headers.get("X-Pubsub-Signature", ""))


class HookReceiver:
    """Records every POST. `statuses` lists the answers to give, in turn; then 200 for good."""

    def __init__(self, port=0, statuses=()):
        self.posts = []
        self.statuses = list(statuses)
        self.answered = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.answered.append((status, body))
                    if status == 200:
                        receiver.posts.append(HookPost(self.headers, body, time.monotonic()))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def events(self):
        with self.lock:
            return [e for p in self.posts for e in p.events]

    def accepted(self):
        with self.lock:
            return list(self.posts)

    def wait_events(self, predicate, timeout=10.0, what="webhook events"):
        """The events received, once `predicate(events)` holds."""
        found = []

        def ready():
            events = self.events()
            if predicate(events):
                found.append(events)
            return bool(found)

        if not wait_until(ready, timeout, raises=False):
            raise AssertionError(f"timed out waiting for {what}; got {self.events()}")
        return found[0]


def hook_broker(urls, *, secret=HOOK_SECRET, extra=(), timeout=45):
    args = []
    for url in urls:
        args += ["--webhook", url]
    if secret is not None:
        args += ["--webhook-secret", secret]
    return Broker(timeout=timeout, extra_args=list(extra) + args)


def hook_bayeux(broker, messages):
    """POSTs a list of Bayeux messages to the broker and returns the replies."""
    return bayeux(broker, messages, timeout=30)


# A handshake that must succeed (its clientId), and a subscribe or (unsubscribe=True) an unsubscribe that must
# succeed, with hook_bayeux's timeout.
hook_handshake = partial(handshake, timeout=30)
hook_subscribe = partial(subscribe, timeout=30)


def hook_metrics(broker) -> dict:
    """`name{labels}` -> value from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        values[name] = float(value)
    return values


def hook_metric(broker, name) -> float:
    return hook_metrics(broker).get(name, 0.0)


def hook_parse_at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
