"""Brokers with the server API on, and small Bayeux and API clients for the API suites (names unique to this
folder: fixtures of one folder are seen by the others when all suites run in one pytest call)."""

import secrets
import threading

import pytest
import requests

from pubsubtest.bayeux import bayeux, connect, handshake, subscribe  # noqa: F401  (bayeux: for the test modules)
from pubsubtest.broker import Broker
from pubsubtest.metrics import held, wait_held

HTTP_TIMEOUT = 10


def new_key():
    return "k-" + secrets.token_hex(16)


class APIBroker(Broker):
    """A pubsub broker with `--api-key`; `api(...)` calls the server API."""

    def __init__(self, key=None, extra_args=(), **kw):
        self.key = key or new_key()
        super().__init__(extra_args=("--api-key", self.key) + tuple(extra_args), target="pubsub", **kw)
        self.http = requests.Session()

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def api(self, method, call, *, key=None, json_body=None, params=None, data=None, headers=None):
        h = {"Authorization": f"apikey {self.key if key is None else key}"}
        if key == "":
            h = {}
        h.update(headers or {})
        return self.http.request(method, f"{self.base}/api/{call}", json=json_body, params=params, data=data,
                                 headers=h, timeout=HTTP_TIMEOUT)

    def ok(self, method, call, **kw):
        r = self.api(method, call, **kw)
        assert r.status_code == 200, (r.status_code, r.text)
        assert r.headers["Content-Type"].startswith("application/json")
        return r.json()


@pytest.fixture
def api_broker():
    with APIBroker(timeout=5) as b:
        yield b


# ------------------------------------------------------------------ Bayeux over long-polling

def api_handshake(b):
    """A handshake offering WebSocket too, and its first connect (answered at once): the clientId."""
    cid = handshake(b, types=("long-polling", "websocket"))
    first = connect(b, cid)
    assert first[-1]["successful"], first
    return cid


def api_subscribe(b, cid, *channels):
    """One /meta/subscribe to all the `channels`, which must succeed."""
    subscribe(b, cid, list(channels))


def parked_connect(b, cid):
    """Starts a long-poll connect in a thread and returns (thread, box) once the broker holds it (its count of
    held connects went up); box[0] gets the reply."""
    before = held(b)
    box = []
    t = threading.Thread(target=lambda: box.append(connect(b, cid, timeout=20)), daemon=True)
    t.start()
    wait_held(b, before + 1)
    assert not box, "the connect was answered at once instead of being held"
    return t, box
