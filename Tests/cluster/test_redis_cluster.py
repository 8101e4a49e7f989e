"""`pubsub serve` nodes on a real Redis Cluster started here (three masters, each with a replica).

The engine keeps its keys under one hash tag (`{pubsub:}`), so they are in one slot of one shard; its node
notifications use sharded pub/sub there. The tests check what users see across nodes (delivery, a long-polling
session hopping between nodes, resume on another node), that the keys and notifications stay in that shard, and
that the nodes follow the slot without a restart when its master is killed and its replica promoted, and when an
operator migrates the slot to another master.
"""

import time

import pytest
import requests

from cluster_helpers import (BayeuxWebSocket, Publisher, Reader, api, handshake, history_positions, long_poll, publish,
                             received, redis_metrics, start_brokers, stop_after_publishing_resumed, subscribe,
                             wait_failover_followed)
from pubsubtest.broker import Broker
from pubsubtest.wait import wait_until

API_KEY = "k-redis-cluster-test-0123456789ab"
TAG = "{pubsub:}"


def start_nodes(cluster, count, seeds):
    """`count` brokers, each told of other nodes of the cluster (`seeds(i)`): they find the slot's master."""
    return start_brokers(count, lambda i: [
        "--engine", "redis", "--redis-cluster", seeds(i), "--history-size", "20000",
        "--api-key", API_KEY, "--log-level", "info"])


def api_publish(node, channel, data):
    r = api(node, API_KEY, "POST", "publish", json={"channel": channel, "data": data})
    assert r.status_code == 200, r.text
    return r.json()["position"]


def test_nodes_share_sessions_and_events_through_one_shard(redis_cluster):
    cluster = redis_cluster
    slot = cluster.slot(TAG)
    owner = cluster.owner(slot)
    # Each broker knows one node of the cluster, a replica or a master that does not serve the slot.
    others = [n for n in cluster.nodes if n is not owner]
    nodes = start_nodes(cluster, 3, lambda i: f"127.0.0.1:{others[i].port}")
    a, b, c = nodes
    try:
        for n in nodes:
            assert f"slot {slot} of '{TAG}'" in n.log(), n.log()

        # Cross-node delivery: a WebSocket subscriber on a gets what b and c publish, in order.
        sub = BayeuxWebSocket(a, handshake(a))
        subscribe(a, sub.cid, "/feed")
        sub.connect()
        sub.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
        for i in range(5):
            assert publish(b if i % 2 else c, "/feed", {"from": "x", "n": i})["successful"]
        sub.read(lambda ms: len(received(sub, "/feed", "x")) >= 5)
        assert received(sub, "/feed", "x") == [0, 1, 2, 3, 4]
        sub.close()

        # A long-polling session hopping between the nodes: made on a, subscribed through b, polled on c, b, a.
        cid = handshake(a)
        subscribe(b, cid, "/hop")
        for i, (via, poll) in enumerate([(a, c), (c, b), (b, a)]):
            reply, _ = long_poll(poll, cid)
            assert reply["successful"], reply
            assert publish(via, "/hop", i)["successful"]
            reply, events = long_poll(poll, cid)
            assert reply["successful"] and [e["data"] for e in events] == [i], (reply, events)

        # Resume on another node: events published through b while a subscriber of a was away come back on c.
        positions = [api_publish(b, "/r", n) for n in range(4)]
        fresh = handshake(c)
        long_poll(c, fresh)
        reply = subscribe(c, fresh, "/r", resume=positions[0], check=False)
        assert reply["successful"] and reply["ext"]["resume"] == {"recovered": True, "missed": 3}, reply
        _, events = long_poll(c, fresh)
        assert [e["data"] for e in events] == [1, 2, 3]

        # Everything is in the slot's shard: its keys, and its node channels as sharded channels; no other master
        # holds a key, and no node has a classic pub/sub channel (which the cluster would broadcast everywhere).
        assert int(owner.command("CLUSTER", "COUNTKEYSINSLOT", slot)) > 0
        masters = [n for n in cluster.nodes if "role:master" in n.command("INFO", "replication")]
        assert len(masters) == 3
        for m in masters:
            if m is not owner:
                assert m.command("DBSIZE") == "0", m.port
        shard_channels = owner.command("PUBSUB", "SHARDCHANNELS").split()
        assert len(shard_channels) == 3 and all(ch.startswith(TAG + "0:n:") for ch in shard_channels), shard_channels
        for n in cluster.nodes:
            assert n.command("PUBSUB", "CHANNELS") == "", n.port
    finally:
        for n in nodes:
            n.stop()


def test_slot_master_killed_and_replica_promoted_nodes_follow(redis_cluster):
    cluster = redis_cluster
    slot = cluster.slot(TAG)
    owner = cluster.owner(slot)
    a, b = nodes = start_nodes(cluster, 2, lambda i: cluster.seeds)
    try:
        pids = (a.pid, b.pid)
        subscribers = {}
        for name, node in (("a", a), ("b", b)):
            client = BayeuxWebSocket(node, handshake(node))
            subscribe(node, client.cid, "/feed")
            client.connect()
            client.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
            subscribers[name] = client
        roamer = handshake(a)
        subscribe(a, roamer, "/roam")
        readers = [Reader(c) for c in subscribers.values()]
        for r in readers:
            r.start()
        publishers = {"a": Publisher(a, "a", "/feed", API_KEY), "b": Publisher(b, "b", "/feed", API_KEY)}
        for p in publishers.values():
            p.start()
        wait_until(lambda: all(len(p.positioned) >= 10 for p in publishers.values()), 15,
                   message="ten events of each publisher acknowledged before the fault")

        owner.kill()
        killed_at = time.monotonic()
        wait_failover_followed(nodes)
        followed_in = time.monotonic() - killed_at
        assert a.pid == pids[0] and b.pid == pids[1] and a.alive() and b.alive(), "a node restarted"
        promoted = cluster.owner(slot)
        assert promoted is not None and promoted is not owner
        assert all(f"127.0.0.1:{promoted.port}" in n.log() for n in nodes)

        stop_after_publishing_resumed(publishers, readers)

        # Sessions made before the kill go on, on either node, without a new handshake.
        for name, node in (("a", a), ("b", b)):
            assert publish(node, "/feed", {"from": "end", "n": name})["successful"]
        for client in subscribers.values():
            client.read(lambda ms: len(received(client, "/feed", "end")) >= 2, timeout=10)
            assert sorted(received(client, "/feed", "end")) == ["a", "b"]
        long_poll(b, roamer)
        assert publish(a, "/roam", "hello")["successful"]
        reply, events = long_poll(b, roamer)
        assert reply["successful"] and [e["data"] for e in events] == ["hello"], (reply, events)

        # What the promoted replica lacks is counted exactly: acknowledged positions missing from its history.
        held = history_positions(a, API_KEY, "/feed")
        metrics = {name: redis_metrics(node) for name, node in (("a", a), ("b", b))}
        for name, p in publishers.items():
            lost = [n for n, pos in p.positioned if pos not in held]
            assert metrics[name]["pubsub_redis_failover_lost_publishes_total"] == len(lost), (metrics, lost)
            assert metrics[name]["pubsub_redis_failovers_total"] == 1, metrics
            # Each subscriber got the events of each publisher in order, none twice.
            for where, client in subscribers.items():
                got = received(client, "/feed", name)
                assert len(got) == len(set(got)), (name, where, "twice")
                # Through Redis, and delivered on the publishing node only while it had no master: each in order.
                # An event whose notification the kill cut off comes from the history once the node is back,
                # after the local-only ones published meanwhile: counted as recovered after a cut.
                positioned = {n for n, _ in p.positioned}
                through_redis = [n for n in got if n in positioned]
                local = [n for n in got if n in set(p.local_only)]
                assert through_redis == sorted(through_redis), (name, where, through_redis)
                assert local == sorted(local), (name, where, local)
                late = [n for k, n in enumerate(got) if n in positioned and any(m > n for m in got[:k])]
                node = a if where == "a" else b
                assert len(late) <= redis_metrics(node)["pubsub_redis_recovered_after_cut_total"], (name, where, late)
        for client in subscribers.values():
            client.close()
        print(f"slot {slot} followed from :{owner.port} to :{promoted.port} in {followed_in:.1f} s; "
              f"local-only {dict((k, len(p.local_only)) for k, p in publishers.items())}; "
              f"failed {dict((k, len(p.failed)) for k, p in publishers.items())}")
    finally:
        for n in nodes:
            n.stop()


def migrate(cluster, slot, source, target, pause=0.0):
    """Moves `slot` with its keys from `source` to `target`, as `redis-cli --cluster reshard` does; `pause`
    holds the slot half-way (migrating, keys not moved yet) for that many seconds."""
    source_id, target_id = cluster.node_id(source), cluster.node_id(target)
    assert target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id) == "OK"
    assert source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id) == "OK"
    time.sleep(pause)
    while True:
        keys = source.command("CLUSTER", "GETKEYSINSLOT", slot, 1000).split()
        if not keys:
            break
        assert source.command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys) == "OK"
    for n in cluster.nodes:
        if "role:master" in n.command("INFO", "replication"):
            assert n.command("CLUSTER", "SETSLOT", slot, "NODE", target_id) == "OK"


def test_slot_migrated_to_another_master_while_publishing_nodes_follow(redis_cluster):
    cluster = redis_cluster
    slot = cluster.slot(TAG)
    owner = cluster.owner(slot)
    target = next(n for n in cluster.nodes if n is not owner and "role:master" in n.command("INFO", "replication"))
    a, b = nodes = start_nodes(cluster, 2, lambda i: cluster.seeds)
    try:
        sub = BayeuxWebSocket(a, handshake(a))
        subscribe(a, sub.cid, "/m")
        sub.connect()
        sub.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
        reader = Reader(sub)
        reader.start()
        roamer = handshake(b)
        subscribe(b, roamer, "/roam")
        publisher = Publisher(b, "p", "/m", API_KEY)
        publisher.start()
        wait_until(lambda: len(publisher.positioned) >= 10, 15, message="ten events acknowledged before the migration")

        # Half a second with the slot migrating (scripts are answered ASK: they wait), then the keys move and the
        # slot is given to the target (commands on the old master are answered MOVED, its sharded channels are
        # unsubscribed): each node follows by itself, without a restart.
        migrate(cluster, slot, owner, target, pause=0.5)
        assert int(target.command("CLUSTER", "COUNTKEYSINSLOT", slot)) > 0
        assert owner.command("DBSIZE") == "0"
        if not wait_until(lambda: all(f"127.0.0.1:{target.port}" in x.log() and requests.get(
                f"http://127.0.0.1:{x.port}/readyz", timeout=5).status_code == 200 for x in nodes), 20, 0.1,
                raises=False):
            pytest.fail(f"nodes did not follow the slot:\n{a.log()[-3000:]}\n{b.log()[-3000:]}")
        count = len(publisher.positioned)
        wait_until(lambda: len(publisher.positioned) >= count + 20, 10, 0.1, raises=False)
        publisher.stop.set()
        publisher.join(timeout=15)
        assert len(publisher.positioned) >= count + 20, "publishing did not go on through the new master"
        last = publisher.positioned[-1][0]
        sub.read(lambda ms: last in received(sub, "/m", "p"), timeout=10)
        reader.stop.set()
        reader.join(timeout=5)

        # Nothing failed: a script refused while the slot moved was sent again. A publish made while b's
        # connection was moving (if any) was delivered on b only and counted as such.
        metrics = {x.port: redis_metrics(x) for x in nodes}
        assert publisher.failed == [], publisher.errors
        assert metrics[b.port]["pubsub_redis_local_only_publishes_total"] == len(publisher.local_only), metrics
        assert metrics[b.port]["pubsub_redis_uncertain_publishes_total"] == 0, metrics
        got = received(sub, "/m", "p")
        assert got == sorted(got) and len(got) == len(set(got)), got
        assert set(n for n, _ in publisher.positioned) <= set(got)
        # The long-polling session made on b before the move is served on a after it.
        long_poll(a, roamer)
        assert publish(b, "/roam", "moved")["successful"]
        reply, events = long_poll(a, roamer)
        assert reply["successful"] and [e["data"] for e in events] == ["moved"], (reply, events)
        for x in nodes:
            assert metrics[x.port]["pubsub_redis_failovers_total"] == 1, metrics
        print(f"slot {slot} migrated from :{owner.port} to :{target.port}; {len(publisher.positioned)} published, "
              f"local-only {len(publisher.local_only)}, retries {[m['pubsub_redis_cluster_retries_total'] for m in metrics.values()]}")
        sub.close()
    finally:
        for x in nodes:
            x.stop()


def test_a_server_not_in_cluster_mode_keeps_the_node_not_ready_and_says_why(redis_server):
    b = Broker(timeout=10, extra_args=["--engine", "redis", "--redis-cluster", f"127.0.0.1:{redis_server.port}",
                                       "--log-level", "info"])
    b.start()
    try:
        assert wait_until(lambda: "cluster support disabled" in b.log(), 10, 0.1, raises=False), b.log()
        assert requests.get(f"http://127.0.0.1:{b.port}/readyz", timeout=5).status_code == 503
        assert b.log().count("no master found for the engine's slot") == 1, b.log()
    finally:
        b.stop()
