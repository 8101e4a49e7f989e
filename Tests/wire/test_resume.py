"""Resume after reconnect (pubsub's position extension) over real sockets, long-polling and WebSocket.

A Faye client ignores `ext.position`; a client that keeps the last one it saw can pass it as `ext.resume` in a
later `/meta/subscribe` and is told whether everything it missed is coming (`recovered: true`) or not.
"""

import json
from functools import partial

import pytest
from websocket import create_connection

from pubsubtest.bayeux import bayeux, connect as bayeux_connect, handshake, publish, subscribe as bayeux_subscribe
from pubsubtest.broker import Broker, target

pytestmark = pytest.mark.skipif(target() != "pubsub", reason="resume is a pubsub extension")

T = 5


# Connects are answered at once (advice timeout 0) and must succeed: replies[0] is theirs, the events follow.
# Subscribes return the reply unasserted, for the test to read its ext.resume.
connect = partial(bayeux_connect, advice_timeout=0, check=True)
subscribe = partial(bayeux_subscribe, check=False)


def handshake_position(b):
    """A handshake: the clientId, and the position its reply gives (resuming from it gets what came after)."""
    reply = handshake(b, reply=True)
    return reply["clientId"], reply["ext"]["position"]


def test_resume_delivers_exactly_what_was_missed_then_live_events():
    with Broker(timeout=T) as b:
        cid, _ = handshake_position(b)
        connect(b, cid)
        assert subscribe(b, cid, "/room/*")["successful"]
        publish(b, "/room/a", 1)
        events = connect(b, cid)[1:]
        assert [e["data"] for e in events] == [1]
        token = events[-1]["ext"]["position"]
        bayeux(b, {"channel": "/meta/disconnect", "clientId": cid})

        publish(b, "/room/a", 2)
        publish(b, "/elsewhere", 99)
        publish(b, "/room/b", 3)

        cid2, _ = handshake_position(b)
        connect(b, cid2)
        reply = subscribe(b, cid2, "/room/*", resume=token)
        assert reply["successful"] is True
        assert reply["ext"] == {"resume": {"recovered": True, "missed": 2}}
        publish(b, "/room/a", 4)
        events = connect(b, cid2)[1:]
        assert [e["data"] for e in events] == [2, 3, 4]
        positions = [e["ext"]["position"] for e in events]
        assert len(set(positions + [token])) == 4


def test_same_message_same_position_for_every_subscriber():
    with Broker(timeout=T) as b:
        a, _ = handshake_position(b)
        c, _ = handshake_position(b)
        for cid in (a, c):
            connect(b, cid)
            subscribe(b, cid, "/x")
        publish(b, "/x", "hello")
        pa = connect(b, a)[1]["ext"]["position"]
        pc = connect(b, c)[1]["ext"]["position"]
        assert pa == pc


def test_token_older_than_history_and_garbage_tokens():
    with Broker(timeout=T, extra_args=["--history-size", "3"]) as b:
        cid, start = handshake_position(b)
        for i in range(5):
            publish(b, "/h", i)
        reply = subscribe(b, cid, "/h", resume=start)
        assert reply["successful"] is True
        assert reply["ext"]["resume"]["recovered"] is False
        for garbage in ["garbage", "", "1.x.y", 42]:
            reply = subscribe(b, cid, "/h", resume=garbage)
            assert reply["successful"] is True
            assert reply["ext"] == {"resume": {"recovered": False, "missed": 0}}


def test_a_restarted_broker_says_it_cannot_recover():
    with Broker(timeout=T) as b:
        cid, token = handshake_position(b)
        connect(b, cid)
        subscribe(b, cid, "/r")
        publish(b, "/r", 1)
        token = connect(b, cid)[1]["ext"]["position"]
    with Broker(timeout=T) as b:
        cid, now = handshake_position(b)
        assert now != token
        reply = subscribe(b, cid, "/r", resume=token)
        assert reply["ext"] == {"resume": {"recovered": False, "missed": 0}}


def test_resume_over_websocket():
    with Broker(timeout=T) as b:
        cid, token = handshake_position(b)
        publish(b, "/ws/a", "missed")
        ws = create_connection(b.ws_url, timeout=T)
        try:
            hs = {"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["websocket"]}
            ws.send(json.dumps([hs]))
            cid = json.loads(ws.recv())[0]["clientId"]
            ws.send(json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket"}]))
            json.loads(ws.recv())  # the first connect is answered at once
            ws.send(json.dumps([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/ws/*",
                                 "ext": {"resume": token}}]))
            got = []
            while not any(m.get("channel") == "/ws/a" for m in got):
                got += json.loads(ws.recv())
            sub = next(m for m in got if m.get("channel") == "/meta/subscribe")
            assert sub["ext"] == {"resume": {"recovered": True, "missed": 1}}
            event = next(m for m in got if m.get("channel") == "/ws/a")
            assert event["data"] == "missed" and "position" in event["ext"]
        finally:
            ws.close()


def test_history_off_means_no_positions():
    with Broker(timeout=T, extra_args=["--history-size", "0"]) as b:
        reply = handshake(b, reply=True, check=False)
        assert "ext" not in reply
        cid = reply["clientId"]
        connect(b, cid)
        subscribe(b, cid, "/n")
        publish(b, "/n", 1)
        assert connect(b, cid)[1:] == [{"channel": "/n", "data": 1}]


def b36(n):
    digits, s = "0123456789abcdefghijklmnopqrstuvwxyz", ""
    while True:
        n, d = divmod(n, 36)
        s = digits[d] + s
        if n == 0:
            return s


def test_positions_are_opaque():
    """Positions come from one counter for every channel; on the wire they say nothing of it: the tokens of
    consecutive events are not consecutive or ordered, and the handshake's does not count other channels' traffic.
    Tokens next to a real one, and the plain format of before (`1.<epoch>.<sequence>`), are not positions."""
    with Broker(timeout=T) as b:
        cid, start = handshake_position(b)
        connect(b, cid)
        subscribe(b, cid, "/o")
        for i in range(20):
            publish(b, "/o", i)
        events = connect(b, cid)[1:]
        assert [e["data"] for e in events] == list(range(20))
        tokens = [e["ext"]["position"] for e in events]
        assert all(t.startswith("2.") for t in tokens + [start]), tokens
        epochs = {t.split(".")[1] for t in tokens + [start]}
        assert len(epochs) == 1
        values = [int(t.split(".")[2], 36) for t in tokens]
        steps = list(zip(values, values[1:]))
        assert not any(abs(b_ - a) == 1 for a, b_ in steps), values
        assert 3 <= sum(1 for a, b_ in steps if a < b_) <= 16, values
        # 20 more on a channel nobody reads; then the handshake's position is the 40th, and looks no nearer.
        for i in range(20):
            publish(b, "/nobody", i)
        _, now = handshake_position(b)
        assert now not in tokens and now != start
        epoch = epochs.pop()
        other, _ = handshake_position(b)
        connect(b, other)
        for forged in [f"1.{epoch}.0", f"1.{epoch}.{b36(20)}", f"2.{epoch}.{b36(values[0] + 1)}",
                       f"2.{epoch}.{b36(max(values[0] - 1, 0))}", f"2.{epoch}.0"]:
            reply = subscribe(b, other, "/o", resume=forged)
            assert reply["successful"] is True
            assert reply["ext"]["resume"]["recovered"] is False, (forged, reply)
        # the real one is exact
        reply = subscribe(b, other, "/o", resume=tokens[17])
        assert reply["ext"] == {"resume": {"recovered": True, "missed": 2}}
        assert [e["data"] for e in connect(b, other)[1:]] == [18, 19]


def test_history_bounded_by_bytes():
    """--history-bytes: five events of about 1 KB against 3,500 bytes: the three newest are held."""
    with Broker(timeout=T, extra_args=["--history-bytes", "3500"]) as b:
        cid, start = handshake_position(b)
        connect(b, cid)
        subscribe(b, cid, "/big")
        for i in range(5):
            publish(b, "/big", {"n": i, "pad": "x" * 1000})
        tokens = [e["ext"]["position"] for e in connect(b, cid)[1:]]
        other, _ = handshake_position(b)
        connect(b, other)
        assert subscribe(b, other, "/big", resume=start)["ext"] == {"resume": {"recovered": False, "missed": 3}}
        assert subscribe(b, other, "/big", resume=tokens[1])["ext"] == {"resume": {"recovered": True, "missed": 3}}
        assert [e["data"]["n"] for e in connect(b, other)[1:]] == [2, 3, 4]
