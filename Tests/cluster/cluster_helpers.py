"""Helpers of the cluster suite: Bayeux over HTTP and WebSocket (the redis-server is pubsubtest.redis's)."""

import json
import time

import websocket

from pubsubtest.bayeux import bayeux

HTTP_TIMEOUT = 10


# ---------------------------------------------------------------- Bayeux over HTTP and WebSocket

def post(b, messages, timeout=HTTP_TIMEOUT):
    return bayeux(b, messages, timeout=timeout)


def handshake(b):
    reply = post(b, {"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["long-polling", "websocket"]})[0]
    assert reply["successful"], reply
    return reply["clientId"]


def subscribe(b, cid, channel):
    reply = post(b, {"channel": "/meta/subscribe", "clientId": cid, "subscription": channel})[0]
    assert reply["successful"], reply
    return reply


def publish(b, channel, data, timeout=HTTP_TIMEOUT):
    return post(b, {"channel": channel, "data": data}, timeout=timeout)[0]


def long_poll(b, cid, timeout=HTTP_TIMEOUT):
    """One /meta/connect; returns (reply, events)."""
    replies = post(b, {"channel": "/meta/connect", "clientId": cid, "connectionType": "long-polling",
                       "advice": {"timeout": 0}}, timeout=timeout)
    connect = [m for m in replies if m.get("channel") == "/meta/connect"][0]
    events = [m for m in replies if m.get("channel") != "/meta/connect"]
    return connect, events


class WSClient:
    """A Bayeux client over one WebSocket, bound to a client id (which may come from another node)."""

    def __init__(self, b, cid):
        self.cid = cid
        self.ws = websocket.create_connection(b.ws_url, timeout=HTTP_TIMEOUT)
        self.pending = []

    def send(self, messages):
        self.ws.send(json.dumps(messages))

    def connect(self):
        self.send([{"channel": "/meta/connect", "clientId": self.cid, "connectionType": "websocket",
                    "advice": {"timeout": 0}}])

    def read(self, until, timeout=10):
        """Reads frames until `until(all messages so far)` is true or the time is up; returns the messages."""
        deadline = time.monotonic() + timeout
        while not until(self.pending) and time.monotonic() < deadline:
            self.ws.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                frame = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                break
            if frame:
                self.pending.extend(json.loads(frame))
        return self.pending

    def events(self):
        return [m for m in self.pending if not m.get("channel", "").startswith("/meta/")]

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
