"""A short soak of every engine configuration over every transport: does the broker's heap stop growing, and do
its descriptors come back, when clients come and go and are woken again and again?

Cells: engine configuration {Redis Cluster with --redis-shards 3 and 1, one Redis, Redis Sentinel, memory} ×
transport {long-polling, websocket, callback-polling (JSON-P), eventsource}, sharded cells first; Sentinel over
long-polling and WebSocket only (its engine is the one-Redis engine, the master found another way; for time).
In each cell a new broker serves CLIENTS clients (soakkit.soak): each client handshakes, subscribes to a channel
of its own (a first segment of its own: over three shards they fall on every shard), is woken by a publish a few
times, unsubscribes, disconnects, closes its sockets and starts again with a new session. After a warm-up the
broker's heap in use (`pubsub_heap_allocated_bytes` on its /metrics) and its VmRSS are read, then 11 times more
until the end of the measured connects, each time with every client waiting for its publish (plan() gives each
cell's numbers). Asserted per cell:

- heap growth per connect after the warm-up (the least-squares slope through those 12 readings, less the
  positions the Redis engines keep for each publish by design: soakkit.acknowledged_positions_bytes()) below
  BOUND, 40 bytes per connect (why, and the figures behind it: plan()'s docstring); a binary that does not serve
  the heap gauge is held to RSS_BOUND on its RSS instead;
- the broker's open descriptors back to what they were before the first client, once every client has left;
- every connect answered with its publish, every handshake, subscribe, unsubscribe and disconnect successful (over
  WebSocket the disconnect answered before the broker closes the socket).

The Redis servers are started once (a 3-master Redis Cluster without replicas, one redis-server, a master with
one sentinel) and shared by the cells; each cell's broker has a key prefix of its own. Without redis-server the
Redis cells are skipped (and reported as skipped). The figures of every cell (heap and RSS) are printed at the end
of the run as a table. The matrix took 3 min 48 s, 2 min 41 s and 2 min 12 s in three runs in a row on two cores
that other builds kept busy (load average 6 down to 1); with 1,000 measured connects in every cell, 5 min 57 s at
a load average of 6 to 11.6.

`PUBSUB_BIN=/tmp/pubsub-before-leakfix python3 -m pytest -q Tests/soak -k cluster-3` fails its four cells: that
binary kept every long-poll connect's shard fan-in, proxies and sink (it has no heap gauge: 560-740 bytes of RSS
per connect against RSS_BOUND), and it closes a WebSocket without answering its /meta/disconnect.
"""

import pytest

from soakkit import ENGINES, TRANSPORTS, Backends, soak

CLIENTS = 20
BOUND = 40  # bytes of heap per connect (see plan())
RSS_BOUND = 300  # bytes of RSS per connect, for a binary without the heap gauge (see plan())


def plan(engine, transport):
    """(connects per session, warm-up connects, measured connects, bound in bytes per connect) of a cell.

    A client starts a new session (and new sockets) every 10 connects. In the 3-shard cells over WebSocket and
    EventSource it does so every 2 connects: there the connection's sink, and so the session's shard fan-in, is
    made once per session and not once per connect (the binary with the fan-in leak grew ~150 bytes of RSS per
    connect there with a new session every 10, ~560-640 with one every 2).

    The bound, 40 bytes per connect, applies to the least-squares slope of the broker's heap in use over the
    connects (12 readings, each with every client waiting for its publish), less the positions of acknowledged
    publishes that each Redis engine keeps with Sentinel or a Redis Cluster (16 bytes per publish until 100,000,
    in doubling steps; soakkit.acknowledged_positions_bytes()). Any object kept per connect costs at least 32
    bytes of heap (malloc's smallest chunk), a Swift object with a field or two, a client id or a dictionary entry
    48 and more; a session's state kept in the cells with a session every 2 connects shows at 80 bytes per session.
    What the bound must stand above: the heap settles after the warm-up in one-off steps of up to 16 KiB (the Swift
    runtime's metadata, allocated when a code path first runs: heaptrack puts those blocks under
    swift_allocateGenericValueMetadata and the like), seen only in the 3-shard cells; one such step amid 1,000
    measured connects moves the slope by up to 25 bytes per connect. Hence 1,000 measured connects in the 3-shard
    cells and 600 in the others, where the heap stays flat to within a KiB. Over 3,300 connects the 3-shard
    EventSource cell settled at +17 KiB by 1,250 and stayed there.

    Measured with a debug build on two busy cores, two runs in a row with these numbers (heap slope, bytes per
    connect): cluster-3 long-polling -1.7 and -0.1, WebSocket -1.9 and 5.7, JSON-P -6.0 and 1.0, EventSource 9.8
    and 10.2; cluster-1 -7.1 to 1.2; one Redis -7.5 to 1.0; Sentinel -8.0 to 1.2; memory -2.1 to 2.3. Two earlier
    runs (1,000 measured connects in every cell; 600 in every cell but the 3-shard WebSocket and EventSource
    ones): -6.8 to 7.9, but 19.2 for the 3-shard WebSocket cell (a 13 KiB step at two thirds of the window).
    The acknowledged positions taken off: 19-26 bytes per connect over three shards, 21-35 over one (a doubling
    to 2,048 slots falls in the window). The RSS slopes of the same runs: -78 to 180.

    Readings taken on the fly and with tcache on, as first tried, gave 14-86 bytes per connect on the Redis
    Cluster cells and 20-42 on one Redis, none of it kept by the broker: per-thread caches of freed chunks filling
    (see soakkit.SoakBroker), what was in flight at the reading, and the acknowledged positions. heaptrack, the
    broker killed amid the 3-shard WebSocket cell after 1,300 and after 3,300 connects, finds the same live heap
    but for those positions (+57 KiB of +68 KiB; the rest in 16 KiB runtime blocks either way).

    A binary without the heap gauge (built before it) is held to RSS_BOUND, 300 bytes of RSS per connect: above
    RSS's allocator steps (~132 KiB, up to 220 bytes per connect over 600 connects; the fixed binary's RSS slopes
    stay under 180) and below the fan-in leak (560-790).
    """
    if engine == "cluster-3" and transport in ("websocket", "eventsource"):
        return 2, 300, 1000, BOUND
    if engine == "cluster-3":
        return 10, 600, 1000, BOUND
    return 10, 600, 600, BOUND


ORDER = ("cluster-3", "cluster-1", "redis", "sentinel", "memory")
assert sorted(ORDER) == sorted(ENGINES)
# Sentinel runs the same engine as one Redis (only the master is found another way): two transports, for time.
CELLS = [pytest.param(engine, transport, id=f"{engine}-{transport}") for engine in ORDER for transport in TRANSPORTS
         if engine != "sentinel" or transport in ("long-polling", "websocket")]


@pytest.fixture(scope="module")
def backends():
    with Backends() as b:
        yield b


@pytest.mark.parametrize("engine,transport", CELLS)
def test_soak(backends, engine, transport):
    if engine != "memory" and Backends.available():
        pytest.skip(Backends.available())
    session_connects, warmup, connects, bound = plan(engine, transport)
    r = soak(backends, engine, transport, clients=CLIENTS, warmup=warmup, connects=connects,
             session_connects=session_connects)
    print(r.describe())
    print("heap less acknowledged positions after warm-up, KiB by connects:", r.heap_curve())
    print("RSS after warm-up +KiB by connects:", r.curve())
    if r.has_heap:
        r.bound = bound
        assert r.heap_slope < bound, (
            f"the broker's heap grew {r.heap_slope:.1f} bytes per connect after the warm-up (bound {bound}): "
            f"{r.describe()}; heap after warm-up, KiB by connects: {r.heap_curve()}")
    else:
        r.bound = f"RSS {RSS_BOUND}"
        assert r.slope < RSS_BOUND, (
            f"the broker grew {r.slope:.0f} bytes of RSS per connect after the warm-up (bound {RSS_BOUND}; this "
            f"binary does not serve pubsub_heap_allocated_bytes): {r.describe()}; RSS after warm-up +KiB by "
            f"connects: {r.curve()}")
    assert r.fds_after <= r.fds_baseline, (
        f"{r.fds_after} descriptors open once every client left, {r.fds_baseline} before the first: {r.describe()}")
