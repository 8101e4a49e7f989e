"""PrivatePub over real sockets: the raw iOS client flow (SocketRocket + PrivatePub) and every refusal.

Each refusal is checked on the wire (the exact reply) and by its effect: a client refused a subscription gets
nothing that is published afterwards, and a refused publish reaches nobody, while a properly signed client
on the same broker does receive the control message (so the silence means something).

Runs against pubsub and, with PUBSUB_TARGET=faye, against Faye 1.4.0 with PrivatePub's extension; the cases
where pubsub deliberately differs (no hang without ext, a bound on future timestamps) are pubsub_only.
"""

import hashlib
import json
import threading
import time

import pytest

from pubsubtest.bayeux import post_form
from pubsubtest.broker import Broker
from pubsubtest.wait import wait_until
from pubsubtest.websocket import BayeuxListener

SECRET = "ios-secret"
EXPIRATION = 3600
WAIT = 10          # seconds for anything that must arrive
QUIET = 1.0        # seconds watched for anything that must not

pytestmark = pytest.mark.timeout(60)


def now_ms():
    return int(round(time.time() * 1000))


def sign(channel, ts, secret=SECRET):
    return hashlib.sha1(f"{secret}{channel}{ts}".encode()).hexdigest()


@pytest.fixture(scope="module")
def pp():
    with Broker(timeout=45, secret=SECRET, signature_expiration=EXPIRATION) as b:
        yield b


def publish_to(b, channel, data, token=SECRET, ext="default"):
    """What PrivatePub.publish_to sends: a form POST with one field, message=<JSON>, no clientId, no id."""
    message = {"channel": channel, "data": data}
    if ext == "default":
        message["ext"] = {"private_pub_token": token}
    elif ext is not None:
        message["ext"] = ext
    return post_form(b, message, timeout=WAIT)


class RawSocket(BayeuxListener):
    """A WebSocket client that talks Bayeux by hand, as an iOS app on SocketRocket does: single JSON objects, a
    numeric version and numeric ids, connects sent on a timer (KeepAlive) rather than on each reply. The shared
    threaded client (pubsubtest.websocket) reads it: replies filed by id, events in order, frames counted."""

    def __init__(self, b):
        super().__init__(b, timeout=WAIT, renew=False)
        self.listen()

    def assert_no_events(self, seconds=QUIET):
        time.sleep(seconds)
        with self.cond:
            assert self.events == [], self.events

    def handshake(self):
        """The iOS handshake: one JSON object (not an array), numeric version 1.0, numeric id."""
        self.send({"channel": "/meta/handshake", "version": 1.0, "supportedConnectionTypes": ["websocket"], "id": 1})
        reply = self.reply(1)
        assert reply["successful"] is True and reply["channel"] == "/meta/handshake", reply
        self.client_id = self.cid = reply["clientId"]
        self.next_id = 100
        return self.client_id

    def connect(self):
        self.next_id += 1
        self.send({"channel": "/meta/connect", "clientId": self.client_id, "connectionType": "websocket",
                   "id": self.next_id})
        return self.next_id

    def subscribe(self, channel, ext):
        self.next_id += 1
        message = {"channel": "/meta/subscribe", "clientId": self.client_id, "subscription": channel,
                   "id": self.next_id}
        if ext is not None:
            message["ext"] = ext
        self.send(message)
        return self.reply(self.next_id)


class KeepAlive:
    """/meta/connect sent on a timer, without waiting for the replies (what the iOS app does)."""

    def __init__(self, sock, every=0.25):
        self.sock = sock
        self.every = every
        self.sent = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop_flag.is_set():
            self.sent.append(self.sock.connect())
            self.stop_flag.wait(self.every)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        self.thread.join(timeout=2)
        return False


def signed(channel, ts=None, secret=SECRET):
    ts = now_ms() if ts is None else ts
    return {"private_pub_signature": sign(channel, ts, secret), "private_pub_timestamp": ts}


# ------------------------------------------------------------------ the iOS flow

def test_ios_socketrocket_flow_receives_publish_to(pp):
    channel = "/messages/ios"
    with RawSocket(pp) as ios:
        cid = ios.handshake()
        reply = ios.subscribe(channel, signed(channel))
        assert reply == {"id": ios.next_id, "clientId": cid, "channel": "/meta/subscribe", "successful": True,
                         "subscription": channel}
        assert isinstance(reply["id"], int)  # numeric ids are echoed as numbers
        with KeepAlive(ios) as keepalive:
            wait_until(lambda: len(keepalive.sent) >= 3, 5, message="a few keep-alives out before any publish")
            assert publish_to(pp, channel, {"text": "hi", "from": "rails"}) == [
                {"channel": channel, "successful": True}]
            assert publish_to(pp, channel, {"channel": channel, "eval": 'alert("hi")'}) == [
                {"channel": channel, "successful": True}]
            events = ios.wait_events(2)
            time.sleep(0.6)  # quiet: no third event comes, while the keep-alives go on
        assert len(keepalive.sent) >= 4
        for event in events:
            assert event["channel"] == channel
            assert "clientId" not in event
            assert event["ext"]["private_pub_token"] is None  # the token never reaches a subscriber
        assert [e["data"] for e in events] == [{"text": "hi", "from": "rails"},
                                               {"channel": channel, "eval": 'alert("hi")'}]
        with ios.cond:
            assert len(ios.events) == 2
            # Every keep-alive that was answered was answered successfully, with its numeric id.
            for id in keepalive.sent:
                for r in ios.replies.get(json.dumps(id), []):
                    assert r["successful"] is True and r["channel"] == "/meta/connect", r


def test_ios_flow_with_privatepub_data_and_eval_wrapping(pp):
    channel = "/messages/wrapped"
    with RawSocket(pp) as ios:
        ios.handshake()
        assert ios.subscribe(channel, signed(channel))["successful"] is True
        with KeepAlive(ios):
            publish_to(pp, channel, {"channel": channel, "data": {"id": 7}})
            publish_to(pp, channel, {"channel": channel, "eval": '$("#chat").append("<li>hi</li>");'})
            events = ios.wait_events(2)
        assert [e["data"] for e in events] == [{"channel": channel, "data": {"id": 7}},
                                               {"channel": channel, "eval": '$("#chat").append("<li>hi</li>");'}]


# ------------------------------------------------------------------ refused subscriptions

def _refused_subscription(pp, channel, ext, error, published_on):
    """`channel` with `ext` is refused with `error`; a later publish on `published_on` reaches only the
    control client."""
    with RawSocket(pp) as victim, RawSocket(pp) as control:
        victim.handshake()
        control.handshake()
        assert control.subscribe(published_on, signed(published_on))["successful"] is True
        reply = victim.subscribe(channel, ext)
        assert reply["successful"] is False, reply
        assert reply["error"] == error
        assert reply["subscription"] == channel
        with KeepAlive(victim), KeepAlive(control):
            assert publish_to(pp, published_on, {"secret": "stuff"})[0]["successful"] is True
            assert [e["data"] for e in control.wait_events(1)] == [{"secret": "stuff"}]
            victim.assert_no_events()


def test_refused_bad_signature(pp):
    ts = now_ms()
    _refused_subscription(pp, "/refuse/a", {"private_pub_signature": "0" * 40, "private_pub_timestamp": ts},
                          "Incorrect signature.", "/refuse/a")


def test_refused_signature_with_another_secret_or_timestamp(pp):
    ts = now_ms()
    _refused_subscription(pp, "/refuse/b", signed("/refuse/b", ts, secret="not-the-secret"),
                          "Incorrect signature.", "/refuse/b")
    _refused_subscription(pp, "/refuse/b", {"private_pub_signature": sign("/refuse/b", ts),
                                            "private_pub_timestamp": ts + 1},
                          "Incorrect signature.", "/refuse/b")


def test_refused_another_channels_signature(pp):
    _refused_subscription(pp, "/refuse/c", signed("/refuse/other"), "Incorrect signature.", "/refuse/c")


def test_refused_expired_signature(pp):
    old = now_ms() - (EXPIRATION + 60) * 1000
    _refused_subscription(pp, "/refuse/d", signed("/refuse/d", old), "Signature has expired.", "/refuse/d")


@pytest.mark.parametrize("pattern", ["/refuse/e/*", "/refuse/**", "/**"])
def test_refused_wildcard_with_a_channels_signature(pp, pattern):
    ts = now_ms()
    _refused_subscription(pp, pattern, {"private_pub_signature": sign("/refuse/e/x", ts),
                                        "private_pub_timestamp": ts},
                          "Incorrect signature.", "/refuse/e/x")


def test_wildcard_with_its_own_signature_is_accepted(pp):
    with RawSocket(pp) as ios:
        ios.handshake()
        assert ios.subscribe("/allowed/*", signed("/allowed/*"))["successful"] is True
        with KeepAlive(ios):
            publish_to(pp, "/allowed/x", 1)
            publish_to(pp, "/allowed/x/deeper", 2)
            publish_to(pp, "/allowed/y", 3)
            ios.wait_events(2)
            time.sleep(QUIET)
        assert [e["data"] for e in ios.events] == [1, 3]


def test_refused_ext_without_signature(pp):
    _refused_subscription(pp, "/refuse/f", {}, "Incorrect signature.", "/refuse/f")
    _refused_subscription(pp, "/refuse/f", {"private_pub_timestamp": now_ms()}, "Incorrect signature.", "/refuse/f")


@pytest.mark.pubsub_only
def test_refused_missing_ext_is_answered(pp):
    # PrivatePub's extension raises here and Faye never answers; pubsub refuses.
    _refused_subscription(pp, "/refuse/g", None, "Incorrect signature.", "/refuse/g")


@pytest.mark.pubsub_only
def test_refused_timestamp_far_in_the_future(pp):
    future = now_ms() + 3600 * 1000
    _refused_subscription(pp, "/refuse/h", signed("/refuse/h", future), "Signature timestamp is in the future.",
                          "/refuse/h")


# ------------------------------------------------------------------ refused publishes

def _refused_publish(pp, channel, **publish_kw):
    with RawSocket(pp) as listener:
        listener.handshake()
        assert listener.subscribe(channel, signed(channel))["successful"] is True
        with KeepAlive(listener):
            reply = publish_to(pp, channel, {"forged": True}, **publish_kw)
            assert reply == [{"channel": channel, "successful": False, "error": "Incorrect token."}]
            listener.assert_no_events()
            publish_to(pp, channel, {"genuine": True})
            assert [e["data"] for e in listener.wait_events(1)] == [{"genuine": True}]
            time.sleep(0.3)
        assert len(listener.events) == 1


def test_refused_publish_wrong_token(pp):
    _refused_publish(pp, "/pub/a", token="wrong")


def test_refused_publish_missing_token(pp):
    _refused_publish(pp, "/pub/b", ext={})
    _refused_publish(pp, "/pub/b", ext={"private_pub_token": None})


@pytest.mark.pubsub_only
def test_refused_publish_missing_ext_is_answered(pp):
    _refused_publish(pp, "/pub/c", ext=None)


def test_refused_publish_over_the_websocket(pp):
    """A browser (or iOS app) holding no token cannot publish on its own socket either."""
    channel = "/pub/ws"
    with RawSocket(pp) as listener, RawSocket(pp) as intruder:
        listener.handshake()
        cid = intruder.handshake()
        assert listener.subscribe(channel, signed(channel))["successful"] is True
        with KeepAlive(listener):
            intruder.send({"channel": channel, "clientId": cid, "data": {"forged": True}, "id": 55,
                           "ext": {"private_pub_token": "guess"}})
            assert intruder.reply(55) == {"id": 55, "clientId": cid, "channel": channel, "successful": False,
                                          "error": "Incorrect token."}
            listener.assert_no_events()
