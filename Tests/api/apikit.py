"""Brokers with the server API on, and small Bayeux and API clients for the API suites (names unique to this
folder: fixtures of one folder are seen by the others when all suites run in one pytest call)."""

import secrets

import pytest
import requests

from pubsubtest.bayeux import bayeux
from pubsubtest.broker import Broker
from pubsubtest.wait import wait_until

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
    reply = bayeux(b, [{"channel": "/meta/handshake", "version": "1.0",
                        "supportedConnectionTypes": ["long-polling", "websocket"]}])
    assert reply[0]["successful"], reply
    cid = reply[0]["clientId"]
    first = bayeux(b, [{"channel": "/meta/connect", "clientId": cid, "connectionType": "long-polling"}])
    assert first[-1]["successful"], first
    return cid


def api_subscribe(b, cid, *channels):
    reply = bayeux(b, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": list(channels)}])
    assert reply[0]["successful"], reply


def api_connect(b, cid, timeout=HTTP_TIMEOUT):
    return bayeux(b, [{"channel": "/meta/connect", "clientId": cid, "connectionType": "long-polling"}],
                  timeout=timeout)


def eventually(predicate, timeout=5.0):
    return wait_until(predicate, timeout)
