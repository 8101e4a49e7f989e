"""Three `pubsub serve --engine redis` nodes and one redis-server, as behind a plain load balancer.

redis-server must be installed (scripts/install-test-deps does it); a missing one fails the suite, never skips it.
(Fixtures live in this module.)
"""

import re
import threading
import time

import requests

import pytest

from cluster_helpers import BayeuxWebSocket, handshake, long_poll, publish, subscribe
from pubsubtest.broker import Broker
from pubsubtest.redis import wait_ready
from pubsubtest.wait import wait_until


@pytest.fixture
def nodes(redis_server):
    """Three nodes sharing one Redis."""
    started = []
    try:
        for _ in range(3):
            b = Broker(timeout=10, extra_args=["--engine", "redis", "--redis-url", redis_server.url,
                                                "--log-level", "info"])
            b.start()
            started.append(b)
        for b in started:
            wait_ready(b)
        yield started
    finally:
        for b in started:
            b.stop()


def data_of(events, channel):
    return [m["data"] for m in events if m.get("channel") == channel]


def test_cross_node_delivery_both_ways(nodes):
    a, b, _ = nodes
    on_a = BayeuxWebSocket(a, handshake(a))
    on_b = BayeuxWebSocket(b, handshake(b))
    try:
        for client, node in ((on_a, a), (on_b, b)):
            subscribe(node, client.cid, "/chat")
            client.connect()
            client.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
        assert publish(b, "/chat", "from b")["successful"]
        assert publish(a, "/chat", "from a")["successful"]
        for client in (on_a, on_b):
            client.read(lambda ms: len(data_of(ms, "/chat")) >= 2)
            assert data_of(client.events(), "/chat") == ["from b", "from a"]
    finally:
        on_a.close()
        on_b.close()


def test_long_polling_client_on_a_different_node_at_every_request(nodes):
    cid = handshake(nodes[0])
    subscribe(nodes[1], cid, "/poll/**")
    received, sent = [], []
    n = 0
    for request in range(30):
        for _ in range(request % 4):
            n += 1
            assert publish(nodes[(request + 2) % 3], "/poll/x", n)["successful"]
            sent.append(n)
        time.sleep(0.02)
        reply, events = long_poll(nodes[request % 3], cid)
        assert reply["successful"], reply
        received += data_of(events, "/poll/x")

    def caught_up():
        if received != sent:
            received.extend(data_of(long_poll(nodes[0], cid)[1], "/poll/x"))
        return received == sent

    wait_until(caught_up, 5, raises=False)
    assert received == sent


def test_kill_9_of_the_node_a_websocket_client_was_on(nodes):
    a, b, c = nodes
    cid = handshake(a)
    subscribe(a, cid, "/k")
    client = BayeuxWebSocket(a, cid)
    client.connect()
    client.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
    assert publish(c, "/k", 1)["successful"]
    client.read(lambda ms: 1 in data_of(ms, "/k"))
    a.kill()
    client.close()
    # The client reconnects through another node with the same client id, and does not subscribe again.
    again = BayeuxWebSocket(b, cid)
    try:
        again.connect()
        msgs = again.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
        connect = [m for m in msgs if m.get("channel") == "/meta/connect"][0]
        assert connect["successful"], connect
        assert publish(c, "/k", 2)["successful"]
        again.read(lambda ms: 2 in data_of(ms, "/k"))
        assert data_of(again.events(), "/k") == [2]
    finally:
        again.close()


def test_redis_restart_in_the_middle_of_a_publish_stream(nodes, redis_server):
    a, b, _ = nodes
    cid = handshake(b)
    subscribe(b, cid, "/stream")
    client = BayeuxWebSocket(b, cid)
    client.connect()
    client.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
    total, rejected, sent = 300, [], [0]
    stop = threading.Event()

    def publisher():
        for i in range(1, total + 1):
            sent[0] = i
            try:
                if not publish(a, "/stream", i, timeout=5).get("successful"):
                    rejected.append(i)
            except Exception:
                rejected.append(i)
            time.sleep(0.01)
        stop.set()

    thread = threading.Thread(target=publisher, daemon=True)
    thread.start()
    wait_until(lambda: sent[0] - len(rejected) >= 30, 15, message="thirty events published before the outage")
    redis_server.kill()
    outage_started = time.monotonic()
    time.sleep(1.0)
    redis_server.start()
    outage = time.monotonic() - outage_started
    thread.join(timeout=60)
    assert stop.is_set()
    # Let the nodes reconnect and resynchronise, then publish a tail that must arrive whole.
    wait_until(lambda: publish(a, "/stream", "probe").get("successful", False), 15, 0.2, raises=False)
    # Redis came back empty: node B cannot deliver what it lost, so its subscribed session is told (its next
    # connect fails with 409 and advice to handshake again), never left silent. Its client does as told.
    client.pending = []
    client.connect()
    replies = client.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
    got = [d for d in data_of(client.events(), "/stream") if d != "probe"]
    told = [m for m in replies if m.get("channel") == "/meta/connect"]
    assert told and told[0].get("successful") is False, replies
    assert told[0]["error"] == f"409:{cid}:Queue overflow" and told[0]["advice"]["reconnect"] == "handshake", told
    client.close()
    fresh = handshake(b)
    subscribe(b, fresh, "/stream")
    client = BayeuxWebSocket(b, fresh)
    client.connect()
    client.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
    for i in range(total + 1, total + 21):
        assert publish(a, "/stream", i)["successful"]
    client.read(lambda ms: total + 20 in data_of(ms, "/stream"), timeout=20)
    tail = [d for d in data_of(client.events(), "/stream") if d != "probe"]
    client.close()
    # In order, no duplicates, and the tail published after the restart is all there.
    assert got == sorted(set(got)), got
    assert tail == list(range(total + 1, total + 21)), tail
    missing = sorted(set(range(1, total + 1)) - set(got))
    local_only = sum(int(n) for n in re.findall(r"pubsub\.redis\.local_only_publishes=(\d+)", a.log()))
    missed_by_b = sum(int(n) for n in re.findall(r"pubsub\.redis\.missed=(\d+)", b.log()))
    print(f"outage {outage:.2f}s: {len(missing)} of {total} missed, {len(rejected)} refused to the publisher, "
          f"{local_only} reached node A's subscribers only, {missed_by_b} counted missed by node B")
    # Every loss was told (the session's 409 above: Redis lost what it held, so node B cannot count it), and it is
    # bounded by the outage.
    assert len(missing) <= int((outage + 3.0) / 0.01), (
        f"missing {missing}\nrejected {rejected}\nnode A:\n{a.log()[-3000:]}\nnode B:\n{b.log()[-3000:]}")
    # The same counts are on /metrics.
    redis_metrics = {}
    for name, node in (("a", a), ("b", b)):
        text = requests.get(f"http://127.0.0.1:{node.port}/metrics", timeout=5).text
        redis_metrics[name] = {k: int(v) for k, v in re.findall(r"^(pubsub_redis_\w+_total) (\d+)", text, re.M)}
        assert redis_metrics[name]["pubsub_redis_outages_total"] >= 1, text
    assert redis_metrics["b"]["pubsub_redis_events_received_total"] >= 20  # at least the tail came through Redis
    # The log is read by a thread of the test: its last line may come after the scrape.
    wait_until(lambda: redis_metrics["a"]["pubsub_redis_local_only_publishes_total"] == sum(
        int(n) for n in re.findall(r"pubsub\.redis\.local_only_publishes=(\d+)", a.log())), 5, raises=False)
    local_only = sum(int(n) for n in re.findall(r"pubsub\.redis\.local_only_publishes=(\d+)", a.log()))
    assert redis_metrics["a"]["pubsub_redis_local_only_publishes_total"] == local_only


def test_resume_on_another_node_and_after_redis_lost_its_data(nodes, redis_server):
    """Positions are made in Redis (opaque, `2.<epoch>.<permuted>`), so a token got through one node resumes on
    another; a Redis that restarted empty has a new epoch and key, and says so (`recovered: false`)."""
    def poll_until(node, cid, count):
        got = []

        def enough():
            got.extend(long_poll(node, cid)[1])
            return len(got) >= count

        wait_until(enough, 10, raises=False)
        return got

    a, b, c = nodes
    cid = handshake(a)
    subscribe(a, cid, "/res/*")
    long_poll(a, cid)
    for i in range(3):
        assert publish(b, "/res/x", i)["successful"]
    events = poll_until(a, cid, 3)
    assert [e["data"] for e in events] == [0, 1, 2]
    tokens = [e["ext"]["position"] for e in events]
    assert all(re.fullmatch(r"2\.[0-9a-z]+\.[0-9a-z]+", t) for t in tokens), tokens
    for i in range(3, 6):
        assert publish(c, "/res/x", i)["successful"]
    # Resumed on node C from the first token: exactly the five after it, wherever the session polls next.
    other = handshake(c)
    long_poll(c, other)
    reply = subscribe(c, other, "/res/*", resume=tokens[0], check=False)
    assert reply["successful"] and reply["ext"] == {"resume": {"recovered": True, "missed": 5}}, reply
    assert [e["data"] for e in poll_until(b, other, 5)] == [1, 2, 3, 4, 5]
    # Redis restarts without its data: the old tokens are foreign now, on every node.
    redis_server.kill()
    time.sleep(0.5)
    redis_server.start()
    for node in nodes:
        wait_ready(node)
    wait_until(lambda: publish(a, "/res/x", "after").get("successful"), 15, 0.2, raises=False)
    fresh = handshake(b)
    long_poll(b, fresh)
    reply = subscribe(b, fresh, "/res/*", resume=tokens[2], check=False)
    assert reply["successful"] and reply["ext"] == {"resume": {"recovered": False, "missed": 0}}, reply


def test_pipelined_frames_of_one_publisher_arrive_in_order(nodes):
    """A WebSocket publisher that sends frame after frame of several publishes each, without waiting for
    replies: every publish waits for a Redis round trip, and a later frame's must not overtake an earlier
    frame's. A subscriber on another node gets them all in the order sent."""
    a, b, _ = nodes
    sub = BayeuxWebSocket(b, handshake(b))
    subscribe(b, sub.cid, "/ordered")
    sub.connect()
    sub.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
    pub = BayeuxWebSocket(a, handshake(a))
    n = 0
    for _ in range(40):
        pub.send([{"channel": "/ordered", "clientId": pub.cid, "data": n + i, "id": str(n + i)} for i in range(10)])
        n += 10
    acks = pub.read(lambda ms: sum(1 for m in ms if m.get("channel") == "/ordered" and "successful" in m) >= n)
    assert all(m["successful"] for m in acks if m.get("channel") == "/ordered"), acks[:3]
    sub.read(lambda ms: len(data_of(sub.events(), "/ordered")) >= n)
    assert data_of(sub.events(), "/ordered") == list(range(n))
    sub.close()
    pub.close()
