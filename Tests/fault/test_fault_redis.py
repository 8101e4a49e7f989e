"""The fault suite's Redis side: the faults are Redis's own. Its master is killed (SIGKILL, without waiting for
the replica, as a crash does) and replaced by its replica, twice in a row, under Sentinel; a Redis Cluster master
is killed and its replica promoted; a Redis is killed and started again empty. Two nodes share the Redis, and a
publisher on each node publishes numbered events all along (faultkit.Publisher, straight to its node). Every kind
of subscriber is on each node: `pubsub subscribe` over WebSocket and long-polling, the ack-extension client,
`client.js` in Chromium and Faye's Ruby client. No fault touches the connections between clients and nodes.

Every client is counted against each publisher apart (faultkit.play with per_publisher): an acknowledged event of
either node is promised to the subscribers of both. What must hold, for every client: no silent loss (an
acknowledged event it never got lies inside a gap it was told of: `recovered: false` for a client with positions,
a session ended with advice handshake for the ack client and for Faye's, whose every new handshake counts as the
announcement); for the clients with positions, each event once and in order. Publishes made while a node has no
master are refused (503), not acknowledged, and promised to no one. The figures of each run are printed at the
end with the client-side ones (conftest.py); docs/RELIABILITY.md keeps a table of them.
"""

import pytest
import requests

from faultclients import AckClient, BrowserClient, FayeRuby, SubscribeCLI
from faultkit import CHANNEL, Publisher, play
from pubsubtest.broker import Broker
from pubsubtest.faultproxy import FaultProxy
from pubsubtest.metrics import metric, scrape
from pubsubtest.redis import RedisCluster, RedisServer, Sentinel, wait_ready
from pubsubtest.wait import wait_until

BROKER_TIMEOUT = 5
POSITIONED = ("pubsub subscribe", "client.js")


@pytest.fixture
def nodes():
    """Starts brokers (`nodes(args)`, twice for two nodes); all stopped after the test."""
    made = []

    def start(args):
        b = Broker(timeout=BROKER_TIMEOUT, target="pubsub", extra_args=["--log-level", "info", *args])
        made.append(b)
        b.start()
        wait_ready(b)
        return b

    yield start
    for b in made:
        b.stop()


@pytest.fixture
def servers():
    """Redis processes the test starts (`servers(server)` starts one and returns it); all stopped afterwards."""
    made = []

    def start(server):
        made.append(server)
        server.start()
        return server

    yield start
    for s in reversed(made):
        s.stop()


def subscribers(node, label, page, page_server):
    """One client of every kind on `node`, each subscribed once this returns."""
    made = []
    try:
        for make in (
                lambda: SubscribeCLI(node.url, CHANNEL, "websocket", name=f"pubsub subscribe (websocket, {label})"),
                lambda: SubscribeCLI(node.url, CHANNEL, "long-polling",
                                     name=f"pubsub subscribe (long-polling, {label})"),
                lambda: AckClient(node.url, CHANNEL, "websocket", name=f"ack client (websocket, {label})"),
                lambda: FayeRuby(node.url, CHANNEL, "websocket", name=f"Faye client (websocket, {label})",
                                 handshake_is_gap=True)):
            made.append(make())
        if page is not None:
            made.append(BrowserClient(page, page_server, node.url, CHANNEL, "websocket",
                                      name=f"client.js in Chromium (websocket, {label})"))
        for c in made:
            c.wait_ready()
    except BaseException:
        for c in made:
            c.stop()
        raise
    return made


def assert_honest(results):
    """No silent loss for any client; each event once and in order for the clients with positions."""
    for r in results:
        assert r.delivered > 0, r.line()
    problems = [r.line() for r in results if r.silent]
    problems += [r.line() for r in results
                 if r.name.startswith(POSITIONED) and (r.duplicates, r.out_of_order) != (0, 0)]
    assert problems == [], "\n".join(problems)


def redis_counter(node, name):
    return metric(scrape(node), name)


def ready(node):
    """/readyz says 200: the node reaches its Redis master and serves."""
    try:
        return requests.get(f"http://127.0.0.1:{node.port}/readyz", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def wait_followed(nodes, failovers, what):
    """Waits until every node counts `failovers` failovers and is ready again."""
    def followed():
        return all(redis_counter(n, "pubsub_redis_failovers_total") >= failovers for n in nodes) and all(
            ready(n) for n in nodes)

    wait_until(followed, 30, 0.2, message=f"{what}: the nodes did not follow the failover\n{nodes[0].log()[-3000:]}")


def test_sentinel_master_killed_twice(nodes, servers, page, page_server):
    """A master and a replica under three sentinels (quorum 2, down after 1 s). The master is killed, the replica
    promoted; the old master comes back empty and becomes the new one's replica; then the new master is killed and
    the first one promoted again."""
    first = servers(RedisServer())
    second = servers(RedisServer(extra_args=["--replicaof", "127.0.0.1", str(first.port)]))
    sentinels = [servers(Sentinel(first)) for _ in range(3)]

    def knows_replica(master, replica):
        return all(f"{replica.port}" in s.command("SENTINEL", "REPLICAS", "mymaster")
                   and s.command("SENTINEL", "SENTINELS", "mymaster").count("127.0.0.1") >= 2
                   for s in sentinels) and "master_link_status:up" in replica.command("INFO", "replication")

    wait_until(lambda: knows_replica(first, second), 20, 0.2,
               message="the sentinels did not find each other and the replica")
    addresses = ",".join(f"127.0.0.1:{s.port}" for s in sentinels)
    args = ["--engine", "redis", "--redis-sentinels", addresses, "--redis-master-name", "mymaster"]
    a, b = nodes(args), nodes(args)
    clients = subscribers(a, "Sentinel, node a", page, page_server) + subscribers(b, "Sentinel, node b", None, None)

    def faults():
        done = []
        for round_, (master, replica) in enumerate(((first, second), (second, first)), start=1):
            wait_until(lambda: knows_replica(master, replica), 30, 0.2,
                       message=f"round {round_}: the replica was not in sync before the kill")
            master.kill()
            wait_followed((a, b), round_, f"round {round_}")
            assert "role:master" in replica.command("INFO", "replication")
            # The killed master comes back empty; the sentinels make it the new master's replica.
            master.start()
            done.append(f"kill -9 of the master on port {master.port}, its replica promoted, the old master "
                        f"back empty as a replica")
        return done

    results = play(clients, [], [Publisher(a.url), Publisher(b.url, first=Publisher.SPAN + 1)], faults=faults,
                   per_publisher=True)
    for n in (a, b):
        print(f"node {n.port}: failovers {redis_counter(n, 'pubsub_redis_failovers_total')}, lost publishes "
              f"{redis_counter(n, 'pubsub_redis_failover_lost_publishes_total')}, refused publishes "
              f"{redis_counter(n, 'pubsub_redis_refused_publishes_total')}")
    assert_honest(results)


def test_cluster_master_killed_and_replica_promoted(nodes, page, page_server):
    """Three masters with a replica each; the master of the engine's slot is killed and its replica promoted."""
    cluster = RedisCluster(masters=3, replicas=1)
    cluster.start()
    try:
        args = ["--engine", "redis", "--redis-cluster", cluster.seeds]
        a, b = nodes(args), nodes(args)
        clients = subscribers(a, "Cluster, node a", page, page_server) + subscribers(b, "Cluster, node b", None,
                                                                                     None)
        slot = cluster.slot("{pubsub:}")

        def faults():
            owner = cluster.owner(slot)
            owner.kill()
            wait_followed((a, b), 1, "Redis Cluster")
            promoted = cluster.owner(slot)
            assert promoted is not None and promoted is not owner
            return [f"kill -9 of the slot's master on port {owner.port}, its replica on {promoted.port} promoted"]

        results = play(clients, [], [Publisher(a.url), Publisher(b.url, first=Publisher.SPAN + 1)], faults=faults,
                       per_publisher=True)
    finally:
        cluster.stop()
    assert_honest(results)


def test_redis_restarted_empty(nodes, servers, page, page_server):
    """One Redis, killed and started again on its port with nothing: its history, sessions and positions gone."""
    redis = servers(RedisServer())
    args = ["--engine", "redis", "--redis-url", redis.url]
    a, b = nodes(args), nodes(args)
    clients = subscribers(a, "Redis restarted empty, node a", page, page_server) + subscribers(
        b, "Redis restarted empty, node b", None, None)

    def faults():
        redis.kill()
        wait_until(lambda: not any(ready(n) for n in (a, b)), 10, 0.05,
                   message="the nodes still said ready without their Redis")
        redis.start()
        wait_until(lambda: all(ready(n) for n in (a, b)), 30, 0.2,
                   message=f"the nodes did not come back to the restarted Redis\n{a.log()[-3000:]}")
        return [f"kill -9 of Redis on port {redis.port}, started again empty"]

    results = play(clients, [], [Publisher(a.url), Publisher(b.url, first=Publisher.SPAN + 1)], faults=faults,
                   per_publisher=True)
    assert_honest(results)


def test_a_partition_longer_than_the_history(nodes, servers, page, page_server):
    """One node cut off from Redis (a blackhole, then a reset) for longer than the history holds, while the other
    node goes on publishing: the cut node's subscribers must be told of the hole (a resume answered
    `recovered: false`, a session ended with advice handshake) and never be handed an event from after it first,
    which would move their positions past the hole and make their resume look complete."""
    history = ["--history-size", "30"]  # one second of events at RATE: the cut is four
    redis = servers(RedisServer())
    proxy = FaultProxy(("127.0.0.1", redis.port), name="redis")
    try:
        cut = nodes(["--engine", "redis", "--redis-url", f"redis://127.0.0.1:{proxy.port}/0", *history])
        publishing = nodes(["--engine", "redis", "--redis-url", redis.url, *history])
        clients = subscribers(cut, "partition > history", page, page_server)
        results = play(clients, [proxy], Publisher(publishing.url), schedule=(("blackhole", 4.0, "reset"),))
        counters = proxy.counters()
    finally:
        proxy.close()
    assert counters.get("resets", 0) > 0, counters
    assert_honest(results)
    unannounced = [r.line() for r in results if not r.announced]
    assert unannounced == [], "a hole of four seconds in a history of one was not announced:\n" + "\n".join(
        unannounced)
