"""Helpers of the cluster suite: Bayeux over HTTP and WebSocket (the redis-server is pubsubtest.redis's)."""

import re
import threading
import time
from functools import partial

import requests

from pubsubtest.bayeux import connect, subscribe  # noqa: F401  (subscribe: for the test modules)
from pubsubtest.bayeux import handshake as bayeux_handshake, publish as bayeux_publish
from pubsubtest.broker import Broker
from pubsubtest.redis import wait_ready
from pubsubtest.wait import wait_until
from pubsubtest.websocket import BayeuxWebSocket  # noqa: F401  (for the test modules)

HTTP_TIMEOUT = 10


# ---------------------------------------------------------------- Bayeux over HTTP and WebSocket

# The suite's handshakes offer WebSocket too (a BayeuxWebSocket goes on with the clientId over one); its publishes
# return the reply unasserted (a test asserts it, or retries until a node takes it); long_poll is a connect answered
# at once, returning (its reply, the events).
handshake = partial(bayeux_handshake, types=("long-polling", "websocket"))
publish = partial(bayeux_publish, check=False)
long_poll = partial(connect, advice_timeout=0, split=True)


# ---------------------------------------------------------------- the API, metrics, publishers and readers

def api(node, api_key, method, call, **kw):
    return requests.request(method, f"http://127.0.0.1:{node.port}/api/{call}",
                            headers={"Authorization": f"apikey {api_key}"}, timeout=10, **kw)


def redis_metrics(node):
    text = requests.get(f"http://127.0.0.1:{node.port}/metrics", timeout=5).text
    return {k: int(v) for k, v in re.findall(r"^(pubsub_redis_\w+_total) (\d+)", text, re.M)}


class Publisher(threading.Thread):
    """Publishes numbered events through one node's API until stopped; remembers how each one ended."""

    def __init__(self, node, name, channel, api_key):
        super().__init__(daemon=True)
        self.node, self.name, self.channel, self.api_key = node, name, channel, api_key
        self.stop = threading.Event()
        self.positioned = []  # acknowledged by Redis: (n, position)
        self.local_only = []  # acknowledged by the node while it had no master: delivered on that node only
        self.refused = []     # refused while the node had no master (503, nothing delivered): to publish again
        self.failed = []      # an error: delivered or not, nobody knows
        self.errors = []
        self.n = 0
        self.session = requests.Session()

    def publish_one(self):
        self.n += 1
        n = self.n
        try:
            r = self.session.post(f"http://127.0.0.1:{self.node.port}/api/publish", timeout=10,
                                  headers={"Authorization": f"apikey {self.api_key}"},
                                  json={"channel": self.channel, "data": {"from": self.name, "n": n}})
        except requests.RequestException as e:
            self.failed.append(n)
            self.errors.append(f"{n}: {e}")
            return
        if r.status_code == 503 and "nothing was delivered" in r.text:
            self.refused.append(n)
        elif r.status_code != 200:
            self.failed.append(n)
            self.errors.append(f"{n}: {r.status_code} {r.text[:200]}")
        elif r.json().get("position"):
            self.positioned.append((n, r.json()["position"]))
        else:
            self.local_only.append(n)

    def run(self):
        while not self.stop.is_set():
            self.publish_one()
            time.sleep(0.005)


class Reader(threading.Thread):
    """Reads a WebSocket client's frames as they come, sending /meta/connect again after each answer."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client = client
        self.stop = threading.Event()

    def run(self):
        answered = 0
        while not self.stop.is_set():
            messages = self.client.read(lambda ms: False, timeout=0.2)
            connects = sum(1 for m in messages if m.get("channel") == "/meta/connect")
            if connects > answered:
                answered = connects
                self.client.connect()


def received(client, channel, name):
    """The numbers of `name`'s events on `channel` that a client got, in the order it got them."""
    return [m["data"]["n"] for m in client.events() if m.get("channel") == channel and m["data"].get("from") == name]


def wait_failover_followed(nodes, timeout=30):
    """Waits until every node counts a failover and says it is ready again; fails with the first node's log."""
    m = []

    def followed():
        m[:] = [redis_metrics(n) for n in nodes]
        return all(x.get("pubsub_redis_failovers_total", 0) >= 1 for x in m) and all(
            requests.get(f"http://127.0.0.1:{n.port}/readyz", timeout=5).status_code == 200 for n in nodes)

    if wait_until(followed, timeout, 0.2, raises=False):
        return
    raise AssertionError(f"no failover followed: {m}\n{nodes[0].log()[-3000:]}")


def history_positions(node, api_key, channel):
    """The positions of every event the history holds for `channel`, page by page through the API."""
    held, since = set(), None
    while True:
        params = {"channel": channel, "limit": 1000}
        if since:
            params["since"] = since
        page = api(node, api_key, "GET", "history", params=params).json()
        held.update(m["position"] for m in page["messages"])
        if not page.get("more") or not page["messages"]:
            return held
        since = page["messages"][-1]["position"]


def stop_after_publishing_resumed(publishers, readers, count=20, timeout=10):
    """Waits until every publisher has had `count` more publishes acknowledged with a position (through the new
    master), then stops the publishers and the readers; fails if publishing did not resume."""
    started = {name: len(p.positioned) for name, p in publishers.items()}
    wait_until(lambda: all(len(p.positioned) - started[n] >= count for n, p in publishers.items()), timeout, 0.1,
               raises=False)
    for p in publishers.values():
        p.stop.set()
    for p in publishers.values():
        p.join(timeout=15)
    assert all(len(p.positioned) - started[n] >= count for n, p in publishers.items()), "publishing did not resume"
    for r in readers:
        r.stop.set()
    for r in readers:
        r.join(timeout=5)


def start_brokers(count, args):
    """`count` brokers with `args(i)` each, every one ready (its Redis engine connected); all stopped on failure."""
    nodes = []
    try:
        for i in range(count):
            b = Broker(timeout=10, extra_args=args(i))
            b.start()
            nodes.append(b)
        for b in nodes:
            wait_ready(b)
        return nodes
    except BaseException:
        for b in nodes:
            b.stop()
        raise
