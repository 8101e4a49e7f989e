"""Two `pubsub serve` nodes on Redis Sentinel: one master, one replica, three sentinels (quorum 2), all started here.

The master is killed with SIGKILL while clients publish through both nodes. Before that, the replica is made to
miss the last writes (its replication link is cut while it is stopped for a moment), so the failover really loses
acknowledged events, as asynchronous replication can. Afterwards both nodes serve again without a restart, the
sessions and subscriptions made before the kill still work, and what was lost is counted exactly in /metrics.

Run twice: with `--redis-when-away refuse` (the default), a publish made while a node has no master is refused
(503, for the publisher to retry), so every acknowledged event reaches every subscriber but those the old master
never replicated (counted); with `local`, it reaches that node's subscribers only (counted as local-only).
"""

import os
import signal
import time

import pytest
import requests

from cluster_helpers import (BayeuxWebSocket, Publisher, Reader, handshake, history_positions, long_poll, publish,
                             received, redis_metrics, stop_after_publishing_resumed, subscribe,
                             wait_failover_followed)
from pubsubtest.broker import Broker
from pubsubtest.metrics import metric, scrape
from pubsubtest.redis import RedisServer, Sentinel, wait_ready
from pubsubtest.wait import wait_until

API_KEY = "k-sentinel-test-0123456789abcdef"
CHANNEL = "/feed"


@pytest.fixture(params=["refuse", "local"])
def sentinel_setup(request):
    master = RedisServer()
    master.start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master.port)])
    replica.start()
    sentinels = []
    nodes = []
    try:
        for _ in range(3):
            s = Sentinel(master)
            s.start()
            sentinels.append(s)
        # A failover needs the sentinels to know each other and the replica: wait until every one does.
        def ready():
            return all("127.0.0.1" in s.command("SENTINEL", "REPLICAS", "mymaster")
                       and s.command("SENTINEL", "SENTINELS", "mymaster").count("127.0.0.1") >= 2
                       for s in sentinels) and "master_link_status:up" in replica.command("INFO", "replication")

        if not wait_until(ready, 20, 0.2, raises=False):
            raise RuntimeError("sentinels did not find each other and the replica:\n" + sentinels[0].log())
        addresses = ",".join(f"127.0.0.1:{s.port}" for s in sentinels)
        for _ in range(2):
            b = Broker(timeout=10, extra_args=[
                "--engine", "redis", "--redis-sentinels", addresses, "--redis-master-name", "mymaster",
                "--history-size", "20000", "--api-key", API_KEY, "--log-level", "info",
                "--redis-when-away", request.param])
            b.start()
            nodes.append(b)
        for b in nodes:
            wait_ready(b)
        yield master, replica, sentinels, nodes, request.param
    finally:
        for b in nodes:
            b.stop()
        for s in sentinels:
            s.stop()
        replica.stop()
        master.stop()


def test_master_killed_while_publishing_both_nodes_follow_the_failover(sentinel_setup):
    master, replica, sentinels, (a, b), when_away = sentinel_setup
    t0 = time.monotonic()
    pids = (a.pid, b.pid)
    # Subscribers on both nodes, WebSocket, and a long-polling session made on a and used later through b.
    subscribers = {}
    for name, node in (("a", a), ("b", b)):
        client = BayeuxWebSocket(node, handshake(node))
        subscribe(node, client.cid, CHANNEL)
        client.connect()
        client.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
        subscribers[name] = client
    roamer = handshake(a)
    subscribe(a, roamer, "/roam")

    readers = [Reader(c) for c in subscribers.values()]
    for r in readers:
        r.start()
    publishers = {"a": Publisher(a, "a", CHANNEL, API_KEY), "b": Publisher(b, "b", CHANNEL, API_KEY)}
    for p in publishers.values():
        p.start()
    wait_until(lambda: all(len(p.positioned) >= 10 for p in publishers.values()), 15,
               message="ten events of each publisher acknowledged before the fault")

    # The replica misses what follows: stopped, its link cut by the master, so nothing more reaches it.
    replica_pid = replica.server_pid()
    os.kill(replica_pid, signal.SIGSTOP)
    try:
        # Acknowledged before the cut: written to the replica's socket in the same turn as the answer.
        replicated = {name: p.positioned[-1][0] for name, p in publishers.items()}
        assert master.command("CLIENT", "KILL", "TYPE", "replica") != "0"
        # Sessions made now are in the old master only: the failover loses them, their node puts them back.
        unreplicated = {name: handshake(node) for name, node in (("a", a), ("b", b))}
        for name, node in (("a", a), ("b", b)):
            subscribe(node, unreplicated[name], "/late")
        time.sleep(0.3)
        master.kill()
    finally:
        os.kill(replica_pid, signal.SIGCONT)
    killed_at = time.monotonic()

    # Both nodes follow the failover by themselves.
    wait_failover_followed((a, b))
    failover_seconds = time.monotonic() - killed_at
    assert a.alive() and b.alive() and a.pid == pids[0] and b.pid == pids[1], "a node restarted"
    assert "role:master" in replica.command("INFO", "replication")
    # Publishing goes on through the new master for a while.
    stop_after_publishing_resumed(publishers, readers)

    # Sessions and subscriptions made before the kill still work, without a new handshake, on either node.
    for name, node in (("a", a), ("b", b)):
        assert publish(node, CHANNEL, {"from": "end", "n": name})["successful"]
    for client in subscribers.values():
        client.read(lambda ms: len([m for m in ms if m.get("channel") == CHANNEL and m["data"].get("from") == "end"]) >= 2,
                    timeout=10)
        ends = [m["data"]["n"] for m in client.events() if m["data"].get("from") == "end"]
        assert sorted(ends) == ["a", "b"], ends
    reply, _ = long_poll(b, roamer)
    assert reply["successful"], reply
    assert publish(a, "/roam", "hello")["successful"]
    reply, events = long_poll(b, roamer)
    assert reply["successful"] and [e["data"] for e in events] == ["hello"], (reply, events)
    for name, node in (("a", a), ("b", b)):
        cid = unreplicated[name]
        reply, _ = long_poll(node, cid)
        assert reply["successful"], reply
        assert publish(b, "/late", name)["successful"]
        reply, events = long_poll(node, cid)
        assert name in [e["data"] for e in events], events

    metrics = {name: redis_metrics(node) for name, node in (("a", a), ("b", b))}

    # Exactly what was lost: acknowledged publishes (with a position) that the new master's history lacks.
    held = history_positions(a, API_KEY, CHANNEL)
    lost = {name: [n for n, pos in p.positioned if pos not in held] for name, p in publishers.items()}
    for name in ("a", "b"):
        assert metrics[name]["pubsub_redis_failover_lost_publishes_total"] == len(lost[name]), (metrics, lost)
        # Only what the old master acknowledged after the replica was cut off can be missing.
        assert all(n > replicated[name] for n in lost[name]), (name, lost[name], replicated[name])
        # The positions a node had seen include its own lost publishes.
        assert metrics[name]["pubsub_redis_failover_lost_positions_total"] >= len(lost[name]), metrics
        # Sessions the new master lacked were put back by their node: the one made there while it was cut off.
        assert metrics[name]["pubsub_redis_sessions_restored_total"] == 1, metrics
    assert sum(len(v) for v in lost.values()) > 0, "the replica was cut off: some acknowledged events must be lost"
    assert all(m["pubsub_redis_failovers_total"] == 1 for m in metrics.values()), metrics

    # What the subscribers saw: every event published through Redis, in order (lost from the history or not: it
    # went out when it was published; except one the kill caught between its acknowledgement and its notification,
    # which the new master lacks too: gone for everyone, and counted above as lost); of the other node's events,
    # none of those it published while it had no master (delivered on that node only, counted as local-only
    # publishes there).
    for name, other in (("a", "b"), ("b", "a")):
        client = subscribers[name]
        for source in ("a", "b"):
            got = received(client, CHANNEL, source)
            assert got == sorted(got), f"{name} got {source}'s events out of order"
            assert len(got) == len(set(got)), f"{name} got some of {source}'s events twice"
        own = set(received(client, CHANNEL, name))
        p = publishers[name]
        cut = ({n for n, _ in p.positioned} | set(p.local_only)) - own
        assert cut <= set(lost[name]), (name, sorted(cut), sorted(lost[name]))
        theirs = set(received(client, CHANNEL, other))
        q = publishers[other]
        missing = ({n for n, _ in q.positioned} | set(q.local_only)) - theirs
        assert set(q.local_only) <= missing and missing - set(q.local_only) <= set(lost[other]), (
            name, sorted(missing), sorted(q.local_only), sorted(lost[other]))
        assert metrics[other]["pubsub_redis_local_only_publishes_total"] == len(q.local_only), metrics
        assert metrics[other]["pubsub_redis_refused_publishes_total"] == len(q.refused), metrics
        if when_away == "refuse":
            # Nothing acknowledged without a position: every acknowledged event reached both nodes' subscribers,
            # but those the old master never replicated, counted above.
            assert q.local_only == [] and missing <= set(lost[other]), (name, sorted(missing), sorted(lost[other]))
        else:
            assert q.refused == [], q.refused
        # A publish that failed is one whose connection broke before Redis answered: counted as uncertain.
        assert metrics[other]["pubsub_redis_uncertain_publishes_total"] == len(q.failed), (metrics, q.errors)
    for client in subscribers.values():
        client.close()
    print({k: p.errors for k, p in publishers.items()})
    print(f"failover followed in {failover_seconds:.1f} s; lost publishes {dict((k, len(v)) for k, v in lost.items())}; "
          f"local-only {dict((k, len(p.local_only)) for k, p in publishers.items())}; "
          f"refused {dict((k, len(p.refused)) for k, p in publishers.items())}; "
          f"failed {dict((k, len(p.failed)) for k, p in publishers.items())}; total {time.monotonic() - t0:.1f} s")


def readyz(node):
    r = requests.get(f"http://127.0.0.1:{node.port}/readyz", timeout=5)
    return r.status_code, r.text


def test_a_node_that_cannot_confirm_its_master_or_follows_a_stale_one_is_not_ready_and_leaves_it():
    """A node cut off from its sentinels (stopped) cannot know whether they replaced its master: it says not ready
    within seconds, and why, and ready again once a sentinel confirms the master. A node whose master the
    sentinels replaced without a word reaching it (no +switch-master, no READONLY: the old master still takes
    writes, as on the far side of a partition) leaves it for the one they name."""
    master = RedisServer()
    master.start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master.port)])
    replica.start()
    sentinel = Sentinel(master, quorum=1)
    node = None
    try:
        sentinel.start()
        node = Broker(timeout=10, extra_args=[
            "--engine", "redis", "--redis-sentinels", f"127.0.0.1:{sentinel.port}", "--redis-master-name",
            "mymaster", "--log-level", "info"])
        node.start()
        wait_ready(node)
        wait_until(lambda: readyz(node)[0] == 200, 10, 0.1, message="the node did not become ready")

        # The sentinel stops answering: after five seconds unconfirmed the node is not ready, and says why.
        os.kill(sentinel.server_pid(), signal.SIGSTOP)
        try:
            wait_until(lambda: readyz(node)[0] == 503, 20, 0.2, message="a node nobody confirms its master stayed ready")
            status, text = readyz(node)
            assert "no sentinel has named" in text and str(master.port) in text, text
        finally:
            os.kill(sentinel.server_pid(), signal.SIGCONT)
        wait_until(lambda: readyz(node)[0] == 200, 20, 0.2, message="the node did not come back once confirmed")
        assert metric(scrape(node), "pubsub_redis_failovers_total") == 0

        # The sentinel now names another master, and tells nobody: the old one still answers as a master.
        assert replica.command("REPLICAOF", "NO", "ONE") == "OK"
        assert sentinel.command("SENTINEL", "REMOVE", "mymaster") == "OK"
        assert sentinel.command("SENTINEL", "MONITOR", "mymaster", "127.0.0.1", replica.port, 1) == "OK"
        assert "role:master" in master.command("INFO", "replication")
        wait_until(lambda: metric(scrape(node), "pubsub_redis_failovers_total") == 1 and readyz(node)[0] == 200,
                   20, 0.2, message=f"the node stayed on a stale master\n{node.log()[-3000:]}")
        log = node.log()
        assert "a sentinel names another Redis master" in log and f"127.0.0.1:{replica.port}" in log, log[-3000:]
        # What it publishes now goes to the master the sentinel names.
        cid = handshake(node)
        subscribe(node, cid, "/stale")
        assert publish(node, "/stale", "after")["successful"]
        reply, events = long_poll(node, cid)
        assert [e["data"] for e in events] == ["after"], (reply, events)
    finally:
        if node:
            node.stop()
        sentinel.stop()
        replica.stop()
        master.stop()


def test_one_sentinel_of_three_does_not_confirm_the_master():
    """A node on the minority side of a partition, with one sentinel of three: that sentinel still names the old
    master (it cannot fail over alone), so one answer is no confirmation. With two of the three stopped, the node
    says not ready within seconds, and why; with one of them back (a majority of two), it is ready again."""
    master = RedisServer()
    master.start()
    sentinels = [Sentinel(master) for _ in range(3)]
    node = None
    try:
        for s in sentinels:
            s.start()
        node = Broker(timeout=10, extra_args=[
            "--engine", "redis", "--redis-sentinels", ",".join(f"127.0.0.1:{s.port}" for s in sentinels),
            "--redis-master-name", "mymaster", "--log-level", "info"])
        node.start()
        wait_ready(node)
        wait_until(lambda: readyz(node)[0] == 200, 10, 0.1, message="the node did not become ready")
        stopped = [sentinels[1], sentinels[2]]
        for s in stopped:
            os.kill(s.server_pid(), signal.SIGSTOP)
        try:
            wait_until(lambda: readyz(node)[0] == 503, 30, 0.2,
                       message="a node only one sentinel of three confirms stayed ready")
            status, text = readyz(node)
            assert "fewer than 2 of the 3 sentinels have named" in text and str(master.port) in text, text
            os.kill(stopped[0].server_pid(), signal.SIGCONT)
            wait_until(lambda: readyz(node)[0] == 200, 30, 0.2, message="two sentinels of three did not confirm it")
        finally:
            for s in stopped:
                os.kill(s.server_pid(), signal.SIGCONT)
    finally:
        if node:
            node.stop()
        for s in sentinels:
            s.stop()
        master.stop()
