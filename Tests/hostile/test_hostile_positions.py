"""Issue 13, item 8: positions reveal nothing about channels the holder cannot read, and resume still works.

Both engines (memory, and Redis with a redis-server of its own). Today a position is `1.<epoch base36>.<sequence base36>` from one global sequence: the handshake reply tells anyone
how many messages flowed anywhere. The tokens are treated as opaque strings here; the test only looks for a
dot-separated part that moves by exactly the number of publishes made in between, in base 10, 16 or 36.
"""

import contextlib
import json
import shutil

import pytest

from hostilekit import hostile_broker
from pubsubtest.bayeux import connect, handshake, publish, subscribe


STEPS = [1, 5, 3]   # publishes between successive handshakes
ENGINES = ["memory", "redis"]


@contextlib.contextmanager
def engine_broker(engine):
    """A hostile_broker on the memory engine, or on the Redis engine with its own redis-server."""
    if engine == "memory":
        with hostile_broker() as bg:
            yield bg
        return
    if not shutil.which("redis-server"):
        pytest.skip("redis-server not installed (scripts/install-test-deps)")
    from pubsubtest.redis import RedisServer
    redis = RedisServer()
    redis.start()
    try:
        with hostile_broker({"engine": "redis", "redis-url": redis.url}) as bg:
            yield bg
    finally:
        redis.stop()


def _as_numbers(part):
    out = {}
    for base in (10, 16, 36):
        try:
            out[base] = int(part, base)
        except ValueError:
            pass
    return out


def counters_in(tokens, steps):
    """The (part index, base) of the tokens whose value moves by exactly `steps` from one token to the next."""
    split = [t.split(".") for t in tokens]
    found = []
    if len({len(p) for p in split}) != 1:
        return found
    for index in range(len(split[0])):
        values = [_as_numbers(p[index]) for p in split]
        for base in (10, 16, 36):
            if all(base in v for v in values):
                deltas = [values[i + 1][base] - values[i][base] for i in range(len(values) - 1)]
                if deltas == steps:
                    found.append((index, base))
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_handshake_positions_do_not_count_other_peoples_messages(engine):
    with engine_broker(engine) as (b, g):
        tokens = [handshake(b, reply=True)["ext"]["position"]]
        for n, step in enumerate(STEPS):
            for i in range(step):
                publish(b, f"/secret/{n}", {"i": i})
            tokens.append(handshake(b, reply=True)["ext"]["position"])
        assert all(isinstance(t, str) and t for t in tokens), tokens
        found = counters_in(tokens, STEPS)
        assert not found, (f"handshake positions {tokens} count the {STEPS} publishes made between them on channels "
                           f"the handshaking client never subscribed to (part, base): {found}")
        g.assert_served()


@pytest.mark.parametrize("engine", ENGINES)
def test_resume_from_the_last_event_gets_exactly_the_missed_ones(engine):
    with engine_broker(engine) as (b, g):
        cid = handshake(b)
        connect(b, cid, advice_timeout=0)
        subscribe(b, cid, "/room/*")
        publish(b, "/room/a", 1)
        events = connect(b, cid, advice_timeout=0)[1:]
        assert [e["data"] for e in events] == [1], events
        token = events[-1]["ext"]["position"]
        # gone: what it misses, and what it must not get
        publish(b, "/room/a", 2)
        publish(b, "/elsewhere", 99)
        publish(b, "/room/b", 3)
        cid2 = handshake(b)
        connect(b, cid2, advice_timeout=0)
        reply = subscribe(b, cid2, "/room/*", resume=token)
        assert reply["ext"]["resume"] == {"recovered": True, "missed": 2}, reply
        publish(b, "/room/a", 4)
        events = connect(b, cid2, advice_timeout=0)[1:]
        assert [e["data"] for e in events] == [2, 3, 4], events
        positions = [e["ext"]["position"] for e in events]
        assert len(set(positions + [token])) == 4, positions
        g.assert_served()


@pytest.mark.parametrize("engine", ENGINES)
def test_resume_from_a_handshake_position_gets_what_was_published_since(engine):
    with engine_broker(engine) as (b, g):
        token = handshake(b, reply=True)["ext"]["position"]
        for i in range(3):
            publish(b, "/since/x", i)
        publish(b, "/other", "no")
        cid = handshake(b)
        connect(b, cid, advice_timeout=0)
        reply = subscribe(b, cid, "/since/*", resume=token)
        assert reply["ext"]["resume"] == {"recovered": True, "missed": 3}, reply
        events = connect(b, cid, advice_timeout=0)[1:]
        assert [e["data"] for e in events] == [0, 1, 2], json.dumps(events)
        g.assert_served()
