"""A short soak of every engine configuration over every transport: does the broker's memory stop growing, and
do its descriptors come back, when clients come and go and are woken again and again?

Cells: engine configuration {Redis Cluster with --redis-shards 3 and 1, one Redis, Redis Sentinel, memory} ×
transport {long-polling, websocket, callback-polling (JSON-P), eventsource}, sharded cells first; Sentinel over
long-polling and WebSocket only (its engine is the one-Redis engine, the master found another way; for time).
In each cell a new broker serves CLIENTS clients (soakkit.soak): each client handshakes, subscribes to a channel
of its own (a first segment of its own: over three shards they fall on every shard), is woken by a publish a few
times, unsubscribes, disconnects, closes its sockets and starts again with a new session. After a warm-up the
broker's VmRSS is read, then 11 times more until the end of the measured connects (plan() gives each cell's
numbers). Asserted per cell:

- RSS growth per connect after the warm-up (the slope through those 12 readings) below the cell's bound (the
  figures a debug build gave, and why the bounds are what they are: plan()'s docstring);
- the broker's open descriptors back to what they were before the first client, once every client has left;
- every connect answered with its publish, every handshake, subscribe, unsubscribe and disconnect successful
  (over WebSocket the broker may close the socket with 1000 instead of answering the disconnect: counted in the
  figures, not failed).

The Redis servers are started once (a 3-master Redis Cluster without replicas, one redis-server, a master with
one sentinel) and shared by the cells; each cell's broker has a key prefix of its own. Without redis-server the
Redis cells are skipped (and reported as skipped). The figures of every cell are printed at the end of the run.
The matrix took 3 min 55 s to 6 min 15 s on two cores that other builds kept busy (load average 5 to 7).

`PUBSUB_BIN=/tmp/pubsub-before-leakfix python3 -m pytest -q Tests/soak -k cluster-3` fails its four cells: that
binary kept every long-poll connect's shard fan-in, proxies and sink.
"""

import pytest

from soakkit import ENGINES, TRANSPORTS, Backends, soak

CLIENTS = 20


def plan(engine, transport):
    """(connects per session, warm-up connects, measured connects, bound in bytes per connect) of a cell.

    A client starts a new session (and new sockets) every 10 connects. In the 3-shard cells over WebSocket and
    EventSource it does so every 2 connects: there the connection's sink, and so the session's shard fan-in, is
    made once per session and not once per connect (the binary with the leak grew ~150 bytes per connect there
    with a new session every 10, ~620 with one every 2; the fixed one ~55-70 and ~90-150).

    The bound applies to the least-squares slope of the broker's VmRSS over the connects, through 12 readings
    from the end of the warm-up to the end (a leak shows in it as in the difference of the two ends; one
    allocator step at either end moves it less). With 1,500 to 2,000 measured connects one step of the heap
    (~132 KiB) is 66 to 90 bytes per connect: the bounds stand above that noise, and far below what the 3-shard
    cells exist to catch. Measured with the fixed debug build on two busy cores, over four runs (slope, bytes per
    connect): cluster-3 43-82 (WebSocket and EventSource with a session every 2: 90-150), cluster-1 8-67, redis
    -43 to 34, sentinel -3 to 67, memory -47 to -1; with the binary that had the leak: cluster-3 long-polling
    788, JSON-P 780, WebSocket 611 and EventSource 636 (a session every 2).
    """
    if engine == "cluster-3" and transport in ("websocket", "eventsource"):
        return 2, 300, 1500, 300
    if engine == "cluster-3":
        return 10, 600, 2000, 200
    return 10, 600, 1500, 200


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
    print("RSS after warm-up +KiB by connects:", r.curve())
    assert r.slope < bound, (
        f"the broker grew {r.slope:.0f} bytes per connect after the warm-up (bound {bound}): "
        f"{r.describe()}; RSS after warm-up +KiB by connects: {r.curve()}")
    assert r.fds_after <= r.fds_baseline, (
        f"{r.fds_after} descriptors open once every client left, {r.fds_baseline} before the first: {r.describe()}")
