"""One service spread over the three masters of a real Redis Cluster (`pubsub serve --redis-shards 3`).

Each shard is a whole engine under a hash tag of its own, in a slot of its own master; a channel is published in
the shard of its first segment. The tests check that every master holds a shard (and that publishes land on all
of them), what users see across nodes (delivery from every shard, a long-polling session hopping between nodes,
resume on another node, a resume of `/**` from the handshake's position), that one shard's master dying stops
neither the other shards nor the nodes, and that the flag is refused without a cluster.
"""

import re
import subprocess
import time

from cluster_helpers import (BayeuxWebSocket, api, handshake, long_poll, publish, redis_metrics, start_brokers,
                             subscribe, wait_failover_followed)
from pubsubtest.broker import pubsub_bin

API_KEY = "k-redis-shards-test-0123456789abc"
CHANNELS = [f"/c{i}/x" for i in range(12)]


def start_nodes(cluster, count):
    return start_brokers(count, lambda i: [
        "--engine", "redis", "--redis-cluster", cluster.seeds, "--redis-shards", "3",
        "--history-size", "1000", "--api-key", API_KEY, "--log-level", "info"])


def shard_tags(node):
    """The shards' hash tags and slots, as the node logs them at start."""
    found = re.findall(r"(\{pubsub:\d+\}) slot (\d+)", node.log())
    assert len(found) == 3, node.log()
    return [(tag, int(slot)) for tag, slot in found]


def masters(cluster):
    return [n for n in cluster.nodes if n.proc.poll() is None and "role:master" in n.command("INFO", "replication")]


def test_channels_spread_over_every_master(redis_cluster):
    cluster = redis_cluster
    a, b, c = nodes = start_nodes(cluster, 3)
    try:
        tags = shard_tags(a)
        owners = [cluster.owner(slot) for _, slot in tags]
        assert len({o.port for o in owners}) == 3, "each shard on a master of its own"

        # A WebSocket subscriber on a, subscribed to every channel, gets what b and c publish on all of them,
        # in order per channel.
        sub = BayeuxWebSocket(a, handshake(a))
        subscribe(a, sub.cid, CHANNELS)
        sub.connect()
        sub.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
        roots = handshake(c)
        subscribe(c, roots, "/**")
        long_poll(c, roots)
        for n in range(4):
            for i, ch in enumerate(CHANNELS):
                assert publish(b if i % 2 else c, ch, {"n": n})["successful"]
        sub.read(lambda ms: sum(1 for m in sub.events() if m.get("channel") in CHANNELS) >= 4 * len(CHANNELS))
        for ch in CHANNELS:
            assert [m["data"]["n"] for m in sub.events() if m.get("channel") == ch] == [0, 1, 2, 3], ch
        sub.close()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 4 * len(CHANNELS) and time.monotonic() < deadline:
            _, events = long_poll(b, roots)
            got += events
        assert sorted((e["channel"], e["data"]["n"]) for e in got) == sorted(
            (ch, n) for ch in CHANNELS for n in range(4)), "a /** subscriber gets every shard's events once"

        # Every shard's history took some of those publishes, each on its own master.
        for (tag, _), owner in zip(tags, owners):
            assert int(owner.command("LLEN", tag + "history")) > 0, tag
        for m in masters(cluster):
            assert int(m.command("DBSIZE")) > 0, m.port
        for n in cluster.nodes:
            assert n.command("PUBSUB", "CHANNELS") == "", n.port

        # A long-polling session hopping between the nodes, on channels of every shard.
        cid = handshake(a)
        subscribe(b, cid, CHANNELS)
        for i, (via, poll) in enumerate([(a, c), (c, b), (b, a)]):
            reply, _ = long_poll(poll, cid)
            assert reply["successful"], reply
            for ch in CHANNELS:
                assert publish(via, ch, i)["successful"]
            events = []
            deadline = time.monotonic() + 10
            while len(events) < len(CHANNELS) and time.monotonic() < deadline:
                reply, more = long_poll(poll, cid)
                assert reply["successful"], reply
                events += more
            assert sorted(e["channel"] for e in events) == sorted(CHANNELS) and {e["data"] for e in events} == {i}

        # Resume on another node from an event's position: the channel's shard answers.
        positions = []
        for n in range(4):
            r = api(b, API_KEY, "POST", "publish", json={"channel": "/r/1", "data": n})
            assert r.status_code == 200, r.text
            positions.append(r.json()["position"])
        fresh = handshake(c)
        long_poll(c, fresh)
        reply = subscribe(c, fresh, "/r/*", resume=positions[0], check=False)
        assert reply["successful"] and reply["ext"]["resume"] == {"recovered": True, "missed": 3}, reply
        _, events = long_poll(c, fresh)
        assert [e["data"] for e in events] == [1, 2, 3]

        # The handshake's position has a part per shard: `/**` resumes from it exactly, over every shard.
        start = handshake(a, types=("long-polling",), reply=True, check=False)["ext"]["position"]
        assert start.count("~") == 2, start
        for ch in CHANNELS:
            assert publish(b, ch, "later")["successful"]
        late = handshake(b)
        long_poll(b, late)
        reply = subscribe(b, late, "/**", resume=start, check=False)
        assert reply["ext"]["resume"] == {"recovered": True, "missed": len(CHANNELS)}, reply
        _, events = long_poll(b, late)
        assert sorted(e["channel"] for e in events) == sorted(CHANNELS)
        # An event's position speaks for its own shard only: for `/**` it is answered honestly.
        reply = subscribe(b, handshake(b), "/**", resume=positions[0], check=False)
        assert reply["ext"]["resume"]["recovered"] is False, reply
    finally:
        for n in nodes:
            n.stop()


def test_one_shards_master_killed_the_others_go_on(redis_cluster):
    """A shard whose master dies is served locally until its replica is promoted; the other shards' channels
    go on across nodes meanwhile, and afterwards every shard serves again without a restart."""
    cluster = redis_cluster
    a, b = nodes = start_nodes(cluster, 2)
    try:
        tags = shard_tags(a)
        owners = [cluster.owner(slot) for _, slot in tags]
        victim = 1
        # A channel of each shard: found from where the publishes' history lands.
        by_shard = {}
        for ch in CHANNELS:
            r = api(a, API_KEY, "POST", "publish", json={"channel": ch, "data": "probe"})
            assert r.status_code == 200, r.text
            for k, ((tag, _), owner) in enumerate(zip(tags, owners)):
                if k not in by_shard and owner.command("LINDEX", tag + "history", "-1").find(ch) >= 0:
                    by_shard[k] = ch
        assert sorted(by_shard) == [0, 1, 2], by_shard
        sub = BayeuxWebSocket(a, handshake(a))
        subscribe(a, sub.cid, list(by_shard.values()))
        sub.connect()
        sub.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))

        owners[victim].kill()
        time.sleep(0.3)
        # The other shards' channels still cross nodes while shard 1 has no master.
        for k in (0, 2):
            assert publish(b, by_shard[k], {"during": k})["successful"]
        sub.read(lambda ms: {m["data"].get("during") for m in sub.events() if isinstance(m.get("data"), dict)}
                 >= {0, 2})

        wait_failover_followed(nodes)
        for k in range(3):
            assert publish(b, by_shard[k], {"after": k})["successful"]
        sub.read(lambda ms: {m["data"].get("after") for m in sub.events() if isinstance(m.get("data"), dict)}
                 >= {0, 1, 2})
        sub.close()
        assert redis_metrics(a)["pubsub_redis_failovers_total"] >= 1
    finally:
        for n in nodes:
            n.stop()


def test_shards_need_a_cluster():
    p = subprocess.run([pubsub_bin(), "serve", "--engine", "redis", "--redis-shards", "3"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 64, (p.stdout, p.stderr)
    assert p.stderr.startswith("Error: --redis-shards and --redis-shard-segments need --redis-cluster\n"), p.stderr
    p = subprocess.run([pubsub_bin(), "serve", "--engine", "redis", "--redis-cluster", "127.0.0.1:1",
                        "--redis-shards", "0"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 64 and "number of shards" in p.stderr, p.stderr
