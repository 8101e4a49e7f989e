"""The authorization hook against a small real HTTP server: allow, deny with text, slow past the timeout, 500, down,
garbage. Every refusal checks that nothing was delivered."""

import time

import pytest

from authkit import (Broker, HookServer, assert_nothing_delivered, bayeux, client_id, closed_port_url, connect,
                     handshake, publish, subscribe)

SECRET = "hook-suite-secret"


@pytest.fixture(scope="module")
def hook():
    with HookServer(slow_seconds=2.5) as h:
        yield h


@pytest.fixture(scope="module")
def broker(hook):
    # --secret so a back end can publish with PrivatePub's token; --auth-hook-timeout 1 so /slow/ is late.
    with Broker(timeout=5, secret=SECRET,
                extra_args=["--auth-hook", hook.url, "--auth-hook-actions", "handshake,subscribe",
                            "--auth-hook-timeout", "1"]) as b:
        yield b


def back_end_publish(b, channel, data):
    reply = publish(b, channel, data, ext={"private_pub_token": SECRET})
    assert reply["successful"] is True, reply


def test_allow_delivers_and_the_app_sees_the_request(broker, hook):
    b = broker
    headers = {"Cookie": "session=abc", "Authorization": "Bearer t", "User-Agent": "auth-suite",
               "Origin": "https://app.example.com"}
    cid = client_id(b, headers=headers)
    connect(b, cid)
    reply = subscribe(b, cid, "/allow/x", ext={"ticket": "t1"}, headers=headers)
    assert reply["successful"] is True, reply
    back_end_publish(b, "/allow/x", "hello")
    _, events = connect(b, cid, advice_timeout=500)
    assert [e["data"] for e in events] == ["hello"]
    question = [q for q in hook.questions("subscribe") if q.get("clientId") == cid][-1]
    assert question["channel"] == "/allow/x"
    assert question["ext"] == {"ticket": "t1"}
    assert question["user"] == "anon"  # the handshake answer's user
    assert question["transport"] == "cross-origin-long-polling"
    assert question["remoteAddress"] == "127.0.0.1"
    assert question["headers"] == {"cookie": "session=abc", "authorization": "Bearer t",
                                   "origin": "https://app.example.com", "user-agent": "auth-suite"}
    hs = [q for q in hook.questions("handshake") if q["headers"].get("cookie") == "session=abc"][-1]
    assert "channel" not in hs and "clientId" not in hs and hs["user"] is None


@pytest.mark.parametrize("channel,error", [
    ("/deny/x", "403:/deny/x:Not your job"),
    ("/slow/x", "503:/slow/x:Authorization unavailable"),
    ("/fail/x", "503:/fail/x:Authorization unavailable"),
    ("/garbage/x", "503:/garbage/x:Authorization unavailable"),
])
def test_refusals_deliver_nothing(broker, channel, error):
    b = broker
    cid = client_id(b)
    connect(b, cid)
    t0 = time.monotonic()
    reply = subscribe(b, cid, channel)
    elapsed = time.monotonic() - t0
    assert reply["successful"] is False, reply
    assert reply["error"] == error
    assert elapsed < 2.0, elapsed  # the timeout (1 s) bounds a slow hook
    back_end_publish(b, channel, "secret")
    assert_nothing_delivered(b, cid)


def test_failures_are_logged_and_counted(broker):
    import requests
    log = broker.log()
    for reason in ["timeout", "status", "unreadable"]:
        assert f"pubsub.auth.hook.failure={reason}" in log, log[-3000:]
    metrics = requests.get(broker.url.replace("/faye", "/metrics"), timeout=10).text
    for reason in ["timeout", "status", "unreadable"]:
        assert f'pubsub_auth_hook_failures_total{{reason="{reason}"}} 1' in metrics, metrics
    assert 'pubsub_auth_hook_answers_total{answer="deny"}' in metrics
    assert 'pubsub_auth_hook_answers_total{answer="allow"}' in metrics


def test_the_handshake_answer_names_the_user_and_the_app_uses_it(broker, hook):
    b = broker
    reply = bayeux(b, [{"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["long-polling"],
                        "ext": {"user": "42"}}])[0]
    cid = reply["clientId"]
    connect(b, cid)
    assert subscribe(b, cid, "/jobs/42")["successful"] is True
    reply = subscribe(b, cid, "/jobs/43")
    assert reply["error"] == "403:/jobs/43:Not your job"
    back_end_publish(b, "/jobs/43", "not yours")
    back_end_publish(b, "/jobs/42", "yours")
    _, events = connect(b, cid, advice_timeout=500)
    assert [e["data"] for e in events] == ["yours"]


def test_a_handshake_the_app_refuses(broker):
    reply = handshake(broker, ext={"password": "wrong"})
    assert reply["successful"] is False
    assert reply["error"] == "403::Wrong password"
    assert "clientId" not in reply


def test_a_hook_that_is_down_refuses():
    with Broker(timeout=5, extra_args=["--auth-hook", closed_port_url()]) as b:
        cid = client_id(b)  # handshakes are not asked (default actions: subscribe)
        connect(b, cid)
        reply = subscribe(b, cid, "/allow/x")
        assert reply["error"] == "503:/allow/x:Authorization unavailable"
        assert_nothing_delivered(b, cid)
        assert "pubsub.auth.hook.failure=unreachable" in b.log()
        # Publishing is decided by no mode here, and the start log says so.
        assert "no authorization mode decides publishes" in b.log()


def test_publish_through_the_hook_and_the_cache():
    with HookServer() as hook, Broker(timeout=5, extra_args=[
            "--auth-hook", hook.url, "--auth-hook-actions", "subscribe,publish", "--auth-hook-cache", "30"]) as b:
        listener = client_id(b)
        connect(b, listener)
        assert subscribe(b, listener, "/allow/feed")["successful"] is True
        assert publish(b, "/allow/feed", "ok")["successful"] is True
        reply = publish(b, "/other/feed", "no")
        assert reply["successful"] is False and reply["error"] == "403:/other/feed:Forbidden"
        _, events = connect(b, listener, advice_timeout=500)
        assert [e["data"] for e in events] == ["ok"]
        # The same question again (another client, same credentials) is answered from the cache.
        before = len(hook.questions("subscribe"))
        other = client_id(b)
        assert subscribe(b, other, "/allow/feed")["successful"] is True
        assert len(hook.questions("subscribe")) == before


def test_websocket_messages_carry_the_upgrade_headers(broker, hook):
    import json
    import websocket
    ws = websocket.create_connection(broker.ws_url, timeout=10, cookie="ws-session=xyz",
                                     header=["Authorization: Bearer ws", "User-Agent: ws-suite"])
    try:
        ws.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                             "supportedConnectionTypes": ["websocket"], "ext": {"user": "42"}}]))
        cid = json.loads(ws.recv())[0]["clientId"]
        ws.send(json.dumps([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/jobs/42"}]))
        reply = json.loads(ws.recv())[0]
        assert reply["successful"] is True, reply
        ws.send(json.dumps([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/deny/ws"}]))
        reply = json.loads(ws.recv())[0]
        assert reply["error"] == "403:/deny/ws:Not your job"
    finally:
        ws.close()
    question = [q for q in hook.questions("subscribe") if q.get("clientId") == cid][0]
    assert question["transport"] == "websocket"
    assert question["user"] == "42"
    assert question["headers"]["cookie"] == "ws-session=xyz"
    assert question["headers"]["authorization"] == "Bearer ws"
    assert question["headers"]["user-agent"] == "ws-suite"
