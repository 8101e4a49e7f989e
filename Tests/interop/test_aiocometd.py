"""aiocometd-ng (an independent CometD client for asyncio, from PyPI) against the broker under test.

aiocometd-ng's Client.open() does the handshake and then waits for the reply to the first /meta/connect.
pubsub answers that connect at once, so against pubsub the whole exchange takes well under 5 s; Faye
holds it for the full server timeout, so against Faye the same exchange takes about that long.
"""

import asyncio
import json
import time

import aiohttp
import pytest

# pubsubtest.broker starts the broker under test (PUBSUB_TARGET=pubsub|faye).
from pubsubtest.broker import Broker, target

# Missing packages: scripts/install-test-deps (pip install -r Tests/requirements.txt).
from aiocometd_ng import Client, ConnectionType
from aiocometd_ng.extensions import Extension

SERVER_TIMEOUT = 10     # the broker's connect hold time (s); Faye holds aiocometd's first connect this long
EXCHANGE_LIMIT = 22     # the whole exchange is abandoned after this many seconds
FAST_LIMIT = 5.0        # against pubsub the whole exchange must take less than this
CHANNEL = "/interop/aio"

pytestmark = pytest.mark.timeout(30)


class WireRecorder(Extension):
    """Keeps every payload the client sends and receives, with a timestamp."""

    def __init__(self, name, log, t0):
        self.name = name
        self.log = log
        self.t0 = t0

    async def outgoing(self, payload, headers):
        self.log.append((round(time.monotonic() - self.t0, 3), self.name, "out",
                         json.loads(json.dumps(payload, default=str))))

    async def incoming(self, payload, headers=None):
        self.log.append((round(time.monotonic() - self.t0, 3), self.name, "in",
                         json.loads(json.dumps(payload, default=str))))


def _messages(log, name, direction):
    return [m for _, n, d, payload in log if n == name and d == direction for m in payload]


def _format(log):
    return "\n".join(f"{t:7.3f} {n} {d} {json.dumps(p)}" for t, n, d, p in log)


async def _exchange(url, connection_type, log, phases, t0):
    """a subscribes; a and b each publish; a receives both; a unsubscribes; both close."""

    def mark(name):
        phases.append((name, round(time.monotonic() - t0, 3)))

    # connection_timeout=0: aiocometd-ng 0.5.6's reconnect watchdog passes loop= to asyncio.wait_for,
    # which Python >= 3.10 rejects; the bounds here are asyncio.wait_for around the whole exchange.
    a = Client(url, [connection_type], connection_timeout=0, extensions=[WireRecorder("a", log, t0)])
    b = Client(url, [connection_type], connection_timeout=0, extensions=[WireRecorder("b", log, t0)])
    if target() == "faye":
        # Under puma, Faye's Rack adapter hijacks the socket, writes the reply and closes the connection
        # without a Connection: close header, so aiohttp's pooled keep-alive connection fails on reuse
        # ("Server disconnected"). Only for the reference server: a session that never reuses connections
        # (aiocometd-ng uses a preset session). pubsub is tested with aiocometd-ng's own session.
        for c in (a, b):
            c._http_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                                    json_serialize=json.dumps)
    try:
        await asyncio.gather(a.open(), b.open())
        mark("open (handshake + first connect answered)")
        assert a.connection_type == connection_type and b.connection_type == connection_type

        await a.subscribe(CHANNEL)
        mark("subscribe")
        assert CHANNEL in a.subscriptions

        ack_a = await a.publish(CHANNEL, {"from": "a", "n": 1})
        ack_b = await b.publish(CHANNEL, {"from": "b", "n": [2, 2.5, None, True, "é"]})
        mark("publish x2")

        received = [await a.receive(), await a.receive()]
        mark("receive x2")

        await a.unsubscribe(CHANNEL)
        mark("unsubscribe")
        assert CHANNEL not in a.subscriptions
        return received, ack_a, ack_b
    finally:
        await asyncio.gather(a.close(), b.close(), return_exceptions=True)
        for c in (a, b):
            # Client.close() leaves the HTTP session open when open() failed after the handshake.
            session = c._http_session
            if session is not None and not session.closed:
                await session.close()
        mark("close")


def _run(url, connection_type):
    log, phases = [], []
    t0 = time.monotonic()

    async def main():
        return await asyncio.wait_for(_exchange(url, connection_type, log, phases, t0), EXCHANGE_LIMIT)

    error = None
    result = None
    try:
        result = asyncio.run(main())
    except BaseException as e:  # noqa: BLE001 - reported with the capture below
        if isinstance(e, KeyboardInterrupt):
            raise
        error = e
    return result, error, time.monotonic() - t0, log, phases


@pytest.fixture(scope="module")
def aio_broker():
    with Broker(timeout=SERVER_TIMEOUT) as b:
        yield b


CONNECTION_TYPES = [
    pytest.param(ConnectionType.WEBSOCKET, id="websocket"),
    pytest.param(ConnectionType.LONG_POLLING, id="long-polling"),
]


def _check(broker, connection_type):
    """Runs the exchange, asserts what was received; returns the elapsed time and the failure context."""
    result, error, elapsed, log, phases = _run(broker.url, connection_type)
    ctx = (f"\n--- phases (s): {phases}\n--- aiocometd-ng wire capture (s since start):\n{_format(log)}"
           f"\n--- server log (tail)\n{broker.log()[-4000:]}")
    assert error is None, f"exchange failed after {elapsed:.2f}s: {error!r}" + ctx
    received, ack_a, ack_b = result

    for name in ("a", "b"):
        hs = [m for m in _messages(log, name, "out") if m["channel"] == "/meta/handshake"]
        assert len(hs) == 1, ctx
        connects = [m for m in _messages(log, name, "out") if m["channel"] == "/meta/connect"]
        assert connects, ctx
        assert {m["connectionType"] for m in connects} == {connection_type.value}, \
            f"{name} connected with {[m['connectionType'] for m in connects]}" + ctx

    got = sorted(((m["channel"], json.dumps(m["data"], sort_keys=True)) for m in received))
    expected = sorted([(CHANNEL, json.dumps({"from": "a", "n": 1}, sort_keys=True)),
                       (CHANNEL, json.dumps({"from": "b", "n": [2, 2.5, None, True, "é"]}, sort_keys=True))])
    assert got == expected, f"received {received}" + ctx
    for m in received:
        assert "successful" not in m, ctx
    for ack in (ack_a, ack_b):
        assert ack.get("successful", True) is True and ack["channel"] == CHANNEL, ctx

    # b never subscribed: nothing may have been pushed to it.
    pushed_to_b = [m for m in _messages(log, "b", "in") if "data" in m and "successful" not in m]
    assert pushed_to_b == [], ctx
    return elapsed, ctx


@pytest.mark.parametrize("connection_type", CONNECTION_TYPES)
def test_subscribe_publish_receive(aio_broker, connection_type):
    _check(aio_broker, connection_type)


@pytest.mark.pubsub_only
@pytest.mark.skipif(target() == "faye", reason="deliberate difference of pubsub from Faye (pubsub_only)")
@pytest.mark.parametrize("connection_type", CONNECTION_TYPES)
def test_first_connect_answered_at_once(aio_broker, connection_type):
    """pubsub answers the first /meta/connect at once, so aiocometd-ng is not kept waiting in open()."""
    elapsed, ctx = _check(aio_broker, connection_type)
    assert elapsed < FAST_LIMIT, f"the exchange took {elapsed:.2f}s (limit {FAST_LIMIT}s)" + ctx
