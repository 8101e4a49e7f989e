"""`pubsub subscribe` resumes on every reconnect of the same session (docs/SUBSCRIBE.md). The broker's answers are
swallowed for a while, then the connection is reset: what was written to it is printed after the reconnect. Then the
connection is reset and held down while events are published: the session queues them, the resumed range covers them
too, and each is printed once. Every reconnect sends the resume subscribe before the connect, in one message list."""

import json

import pytest

from pubsubtest.bayeux import publish
from pubsubtest.broker import Broker, pubsub_bin
from pubsubtest.process import Lines
from pubsubtest.faultproxy import FaultProxy
from pubsubtest.wait import wait_until

pytestmark = pytest.mark.timeout(60)


def numbers(sub):
    return [json.loads(line)["data"]["n"] for line in sub.lines()]


def positions(sub):
    return [json.loads(line)["ext"]["position"] for line in sub.lines()]


@pytest.mark.parametrize("transport", [[], ["--websocket"]], ids=["long-polling", "websocket"])
def test_a_reset_connection_is_resumed_on_the_same_session_without_a_lost_or_repeated_event(transport):
    with (Broker(timeout=45, extra_args=["--history-size", "100"]) as b,
          FaultProxy(("127.0.0.1", b.port), record=True) as proxy):
        sub = Lines([pubsub_bin(), "subscribe", "--url", proxy.url, "--full", *transport, "/feed/*"])
        try:
            sub.wait_for(lambda: "subscribed to" in sub.errors(), 30, "the subscription")
            for n in range(1, 4):
                publish(b, "/feed/a", {"n": n})
            wait_until(lambda: len(sub.lines()) == 3, 10, message="the first events")
            # Written by the broker (pushed on the WebSocket, or the held connect's answer), never delivered.
            proxy.stall()
            publish(b, "/feed/a", {"n": 4})
            proxy.reset()
            wait_until(lambda: 4 in numbers(sub), 20, message="the event written to the broken connection")
            # Published while the subscriber cannot reconnect: queued on its session, and in the resumed range too.
            proxy.reset(hold=True)
            for n in range(5, 8):
                publish(b, "/feed/a", {"n": n})
            proxy.heal()
            wait_until(lambda: sub.errors().count("resumed /feed/*") == 2, 20, message="the second resume")
            publish(b, "/feed/a", {"n": 8})
            # In order: an event printed twice would come before the last one.
            wait_until(lambda: 8 in numbers(sub), 20, message="the last event")
            assert numbers(sub) == list(range(1, 9)), (numbers(sub), sub.errors())
            assert len(set(positions(sub))) == 8
            errors = sub.errors()
            assert "connection to the broker broke" in errors and "resumed /feed/*: recovered" in errors, errors
            assert "ended this session" not in errors, errors
            # Each reconnect's first message list: the resume subscribe from the last event printed, then the connect.
            lists = proxy.sent()
            resumed = [messages for messages in lists
                       if any(m.get("channel") == "/meta/subscribe" and "resume" in (m.get("ext") or {})
                              for m in messages)]
            assert len(resumed) == 3, lists          # the first subscribe (from the handshake's position), then two
            session = resumed[0][0]["clientId"]
            for messages, last in zip(resumed[1:], [3, 4]):
                assert [m["channel"] for m in messages] == ["/meta/subscribe", "/meta/connect"], messages
                assert messages[0]["ext"]["resume"] == positions(sub)[last - 1], (messages, positions(sub))
                assert messages[0]["clientId"] == messages[1]["clientId"] == session
        finally:
            sub.stop()
