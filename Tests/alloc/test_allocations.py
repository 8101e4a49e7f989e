"""Allocation counts, as swift-nio counts them (its IntegrationTests/tests_04_performance): the broker binary runs
under a preloaded counter of malloc, calloc, realloc and the aligned allocators (`alloccount.c`, built here with
the system's C compiler), every thread included; each workload reads the count before and after it and divides
by what it did. A count above its threshold in `thresholds.json` fails; a count well under it says so, for the
threshold to be lowered. Counts, never times.

The thresholds are per build: `debug` (what `scripts/test` builds, so CI checks it) and `release`
(PUBSUB_ALLOC_BUILD=release with PUBSUB_BIN a release binary). A change that adds an allocation to a path is caught
by either; the release figures are the product's (docs/BENCHMARKS.md, "Allocations").
"""

import http.client
import json
import os
import shutil
import struct
import subprocess

import pytest

from pubsubtest.broker import Broker
from pubsubtest.compression import WebSocketSession
from pubsubtest.websocket import BayeuxWebSocket

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("PUBSUB_ALLOC_BUILD", "debug")
with open(os.path.join(HERE, "thresholds.json")) as f:
    THRESHOLDS = json.load(f)[BUILD]
MEASURED = {}


@pytest.fixture(scope="module")
def preload(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert compiler, "no C compiler (cc, gcc or clang) to build the allocation counter"
    library = str(tmp_path_factory.mktemp("alloc") / "alloccount.so")
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", library, os.path.join(HERE, "alloccount.c")],
                   check=True)
    return library


class Counted:
    """A broker under the counter; `count()` is the allocations it made so far."""

    def __init__(self, preload, directory, **kw):
        self.path = str(directory / "allocations")
        self.broker = Broker(env={"LD_PRELOAD": preload, "ALLOC_COUNTER_FILE": self.path}, **kw)

    def __enter__(self):
        self.broker.start()
        assert self.count() > 0, "the counter counted nothing: was it preloaded?"
        return self

    def __exit__(self, *exc):
        self.broker.stop()

    def count(self):
        with open(self.path, "rb") as f:
            return struct.unpack("<Q", f.read(8))[0]


class KeptAlive:
    """Bayeux over one kept-alive HTTP connection, as a back end publishes."""

    def __init__(self, broker):
        self.connection = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)

    def post(self, messages):
        self.connection.request("POST", "/faye", json.dumps(messages), {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body)
        return json.loads(body)

    def publish(self, channel, data):
        replies = self.post([{"channel": channel, "data": data}])
        assert replies[0]["successful"] is True, replies


def per(counted, each, warm_up, times):
    """Allocations per `each()` call: `warm_up` calls first (caches, pools, first-use paths), then `times`."""
    for i in range(warm_up):
        each(i)
    before = counted.count()
    for i in range(warm_up, warm_up + times):
        each(i)
    return (counted.count() - before) / times


def check(name, value):
    MEASURED[name] = value
    limit = THRESHOLDS[name]
    print(f"allocations {BUILD} {name}: {value:.2f} (threshold {limit})")
    assert value <= limit, f"{name}: {value:.2f} allocations, over the threshold of {limit} ({BUILD})"


def test_an_http_publish_to_a_channel_nobody_follows(preload, tmp_path):
    with Counted(preload, tmp_path) as counted:
        http = KeptAlive(counted.broker)
        check("http_publish", per(counted, lambda i: http.publish("/nobody", {"n": i}), 50, 300))


def test_a_websocket_publish(preload, tmp_path):
    with Counted(preload, tmp_path) as counted:
        ws = BayeuxWebSocket(counted.broker)
        ws.handshake()

        def publish(i):
            ws.send([{"channel": "/nobody", "clientId": ws.cid, "data": {"n": i}, "id": str(i)}])
            reply = ws.recv()
            assert reply[0]["successful"] is True, reply
        check("websocket_publish", per(counted, publish, 50, 300))
        ws.close()


def test_a_handshake_subscribe_and_first_connect(preload, tmp_path):
    with Counted(preload, tmp_path) as counted:
        http = KeptAlive(counted.broker)

        def session(i):
            cid = http.post([{"channel": "/meta/handshake", "version": "1.0",
                              "supportedConnectionTypes": ["long-polling"]}])[0]["clientId"]
            assert http.post([{"channel": "/meta/subscribe", "clientId": cid,
                               "subscription": f"/jobs/{i}"}])[0]["successful"] is True
            replies = http.post([{"channel": "/meta/connect", "clientId": cid, "connectionType": "long-polling",
                                  "advice": {"timeout": 0}}])
            assert replies[0]["successful"] is True, replies
        check("handshake_subscribe_connect", per(counted, session, 20, 100))


def test_long_polling_delivery(preload, tmp_path):
    """One subscriber over long-polling; each round a publish over another connection, then the subscriber's
    connect, answered at once with the event."""
    with Counted(preload, tmp_path) as counted:
        publisher, subscriber = KeptAlive(counted.broker), KeptAlive(counted.broker)
        cid = subscriber.post([{"channel": "/meta/handshake", "version": "1.0",
                                "supportedConnectionTypes": ["long-polling"]}])[0]["clientId"]
        subscriber.post([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/lp"}])

        def round_trip(i):
            publisher.publish("/lp", {"n": i})
            replies = subscriber.post([{"channel": "/meta/connect", "clientId": cid,
                                        "connectionType": "long-polling", "advice": {"timeout": 0}}])
            assert [m["data"]["n"] for m in replies if m.get("channel") == "/lp"] == [i], replies
        check("long_polling_delivery", per(counted, round_trip, 30, 200))


def subscribers(broker, count, channel):
    """`count` WebSocket sessions subscribed to `channel`, each with a /meta/connect held."""
    sessions = []
    for _ in range(count):
        ws = BayeuxWebSocket(broker, timeout=30)
        ws.handshake()
        ws.subscribe(channel)
        ws.connect(advice_timeout=600_000)
        sessions.append(ws)
    return sessions


def receive(ws, wanted):
    """Reads `ws` until it has the events numbered `wanted` (a set), renewing its connect when one is answered."""
    seen = set()
    while not wanted <= seen:
        for m in ws.recv(timeout=30):
            if m.get("channel") == "/meta/connect":
                ws.connect(advice_timeout=600_000)
            elif "data" in m:
                seen.add(m["data"]["n"])
    return seen


@pytest.mark.timeout(300)
def test_a_broadcast_to_1000_websocket_subscribers_one_event_per_write(preload, tmp_path):
    """Each publish once every subscriber had the one before: every delivery is a write of its own. The count per
    delivery includes the publish's own, amortized over the 1,000 deliveries, and the connect each session renews
    every 32 events (`ConnectionStateMachine.confirmEvery`, at most once a second), amortized over those 32: the
    warm-up takes every session past its first renewal, and the 64 broadcasts measured hold two more of each."""
    with Counted(preload, tmp_path, timeout=900) as counted:
        sessions = subscribers(counted.broker, 1000, "/broadcast")
        http = KeptAlive(counted.broker)

        def broadcast(i):
            http.publish("/broadcast", {"n": i})
            for ws in sessions:
                receive(ws, {i})
        check("broadcast_1000_per_delivery", per(counted, broadcast, 40, 64) / 1000)
        for ws in sessions:
            ws.close()


@pytest.mark.timeout(300)
def test_a_batched_fan_out_to_100_websocket_subscribers(preload, tmp_path):
    """20 events in one publish request, as fast as the subscribers take them: the broker may write several in a
    frame."""
    with Counted(preload, tmp_path, timeout=900) as counted:
        sessions = subscribers(counted.broker, 100, "/fan")
        http = KeptAlive(counted.broker)

        def burst(i):
            numbers = range(i * 20, i * 20 + 20)
            replies = http.post([{"channel": "/fan", "data": {"n": n}} for n in numbers])
            assert all(r["successful"] is True for r in replies), replies
            for ws in sessions:
                receive(ws, set(numbers))
        check("batched_fan_out_100_per_delivery", per(counted, burst, 3, 20) / 2000)
        for ws in sessions:
            ws.close()


@pytest.mark.timeout(300)
def test_a_compressed_broadcast_to_100_websocket_subscribers(preload, tmp_path):
    """permessage-deflate negotiated by Python's `websockets`; a job-progress-sized event, one per write."""
    with Counted(preload, tmp_path, timeout=900) as counted:
        sessions = []
        for _ in range(100):
            session = WebSocketSession(counted.broker)
            assert session.extensions == ["permessage-deflate"], session.answered
            session.subscribe("/deflate")
            sessions.append(session)
        http = KeptAlive(counted.broker)
        body = "progress " * 60

        def broadcast(i):
            http.publish("/deflate", {"n": i, "log": body})
            for session in sessions:
                event = session.event("/deflate", timeout=30)
                assert event["data"]["n"] == i, event
        check("compressed_broadcast_100_per_delivery", per(counted, broadcast, 5, 30) / 100)
        for session in sessions:
            session.close()
