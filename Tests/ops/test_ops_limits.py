"""Every limit gives a clear answer, with its headers, and leaves other clients alone: --max-connections (503,
Retry-After), publish rate limits per IP and per token (429, Retry-After, X-RateLimit-*), and the per-client
limits that already existed (queue, subscriptions, request size, frame size)."""

import contextlib
import http.client
import json
import socket
import time

import pytest
import requests
import websocket

from pubsubtest.websocket import BayeuxWebSocket
from opshelp import Broker, bayeux, connect, handshake, metric, publish, scrape, subscribe, wait_until

pytestmark = pytest.mark.timeout(120)


def raw_request(port, body=None, path="/faye", source="127.0.0.1", headers=None, method=None):
    """One HTTP request from a chosen loopback source address; returns (status, headers, body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    data = None if body is None else json.dumps(body)
    conn.request(method or ("GET" if body is None else "POST"), path, body=data, headers=h)
    r = conn.getresponse()
    result = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode())
    conn.close()
    return result


# ---------------------------------------------------------------- --max-connections

def test_max_connections_answers_503_with_retry_after_and_spares_open_connections():
    with Broker(timeout=5, extra_args=["--max-connections", "3"]) as b:
        held = []
        for _ in range(3):
            c = http.client.HTTPConnection("127.0.0.1", b.port, timeout=10)
            c.request("GET", "/healthz")
            r = c.getresponse()
            assert r.status == 200 and r.read() == b"ok\n"
            held.append(c)
        status, headers, text = raw_request(b.port, path="/healthz")
        assert status == 503
        assert headers["retry-after"] == "1"
        assert headers["connection"] == "close"
        assert "Too many connections (limit 3)" in text
        # The three open connections are unaffected: each still serves a Bayeux request.
        for c in held:
            c.request("POST", "/faye", body=json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                                         "supportedConnectionTypes": ["long-polling"]}]),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            assert r.status == 200 and json.loads(r.read())[0]["successful"] is True
        # Once one closes, a new connection is accepted again.
        held.pop().close()
        wait_until(lambda: raw_request(b.port, path="/healthz")[0] == 200, 5, message="room again")
        for c in held:
            c.close()
        assert "connections refused: --max-connections reached" in b.log()


# ---------------------------------------------------------------- publish rate limits

def ratelimit_headers(headers):
    return {k: headers.get(k) for k in ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset")}


def test_per_ip_publish_limit_answers_429_with_headers_and_spares_other_addresses():
    with Broker(timeout=5, extra_args=["--publish-limit-per-ip", "3", "--publish-limit-window", "3"]) as b:
        for remaining in (2, 1, 0):
            status, headers, text = raw_request(b.port, [{"channel": "/x", "data": 1}])
            assert status == 200, text
            assert ratelimit_headers(headers) == {"x-ratelimit-limit": "3", "x-ratelimit-remaining": str(remaining),
                                                  "x-ratelimit-reset": headers["x-ratelimit-reset"]}
            assert 1 <= int(headers["x-ratelimit-reset"]) <= 3
        status, headers, text = raw_request(b.port, [{"channel": "/x", "data": 1}])
        assert status == 429, text
        assert headers["retry-after"] == "1"  # one message comes back every second
        assert headers["x-ratelimit-limit"] == "3" and headers["x-ratelimit-remaining"] == "0"
        assert headers["x-ratelimit-reset"] == "3"
        assert "Publish rate limit exceeded: 3 messages per 3.0 seconds per client address" in text

        # Meta messages are not publishes: a handshake passes and carries no rate-limit headers.
        status, headers, _ = raw_request(b.port, [{"channel": "/meta/handshake", "version": "1.0",
                                                   "supportedConnectionTypes": ["long-polling"]}])
        assert status == 200 and "x-ratelimit-limit" not in headers
        # Another address has its own budget.
        status, headers, _ = raw_request(b.port, [{"channel": "/x", "data": 1}], source="127.0.0.2")
        assert status == 200 and headers["x-ratelimit-remaining"] == "2"
        # After Retry-After, the first address may publish again.
        time.sleep(1.1)
        status, headers, _ = raw_request(b.port, [{"channel": "/x", "data": 1}])
        assert status == 200 and headers["x-ratelimit-remaining"] == "0"
        # WebSocket publishes spend the same budget: this address has none left.
        ws = websocket.create_connection(b.ws_url, timeout=10)
        ws.send(json.dumps([{"channel": "/x", "data": i} for i in range(5)]))
        assert [m["error"].partition(",")[0] for m in json.loads(ws.recv())] == ["429:/x"] * 5
        ws.close()


@contextlib.contextmanager
def limited_broker(limit, channel):
    """A broker allowing `limit` publishes per client address a minute, a long-polling listener on `channel`, and
    a handshaken WebSocket client: yields (broker, listener's client id, WebSocket client)."""
    with Broker(timeout=5, extra_args=["--publish-limit-per-ip", str(limit), "--publish-limit-window", "60"]) as b:
        listener = handshake(b.url)
        subscribe(b.url, listener, channel)
        with BayeuxWebSocket(b, timeout=30) as ws:
            ws.handshake()
            yield b, listener, ws


def delivered(b, listener, channel, count):
    """The data of the events on `channel` the listener got, once it has `count` of them."""
    got = []
    wait_until(lambda: got.extend(m["data"] for m in connect(b.url, listener, advice_timeout=0)
                                  if m.get("channel") == channel) or len(got) >= count, 10,
               message=f"{count} events on {channel}")
    return got


def test_websocket_publishes_are_limited_with_a_bayeux_error_and_spare_the_frame_meta_messages():
    with limited_broker(3, "/x") as (b, listener, ws):
        ws.send([{"channel": "/x", "data": i, "id": f"p{i}"} for i in range(2)])
        assert [(m["id"], m["successful"]) for m in ws.recv()] == [("p0", True), ("p1", True)]
        # Two more do not fit in the one left: the frame's publishes are refused whole, each with Faye's
        # `code:args:message` (the channel, then the seconds to wait), and its connect is answered as usual.
        ws.send([{"channel": "/meta/connect", "clientId": ws.cid, "connectionType": "websocket",
                  "advice": {"timeout": 0}, "id": "c1"},
                 {"channel": "/x", "data": 2, "id": "p2"}, {"channel": "/x", "data": 3, "id": "p3"}])
        replies = {m.get("id"): m for m in ws.read(lambda ms: len(ms) >= 3)}
        assert replies["c1"]["successful"] is True
        for key in ("p2", "p3"):
            assert replies[key]["successful"] is False and replies[key]["channel"] == "/x"
            code, args, text = replies[key]["error"].split(":")
            assert (code, text) == ("429", "Publish rate limit exceeded") and args.split(",")[0] == "/x"
            assert 1 <= int(args.split(",")[1]) <= 40  # two tokens at 3 per 60 s
        # The refusal spent nothing: one publish still fits, and over HTTP the same address is out of budget.
        ws.send({"channel": "/x", "data": 4, "id": "p4"})
        assert ws.recv()[0]["successful"] is True
        assert raw_request(b.port, [{"channel": "/x", "data": 5}])[0] == 429
        # Only what was accepted was delivered.
        assert delivered(b, listener, "/x", 3) == [0, 1, 4]
        samples = scrape(f"http://127.0.0.1:{b.port}/metrics")
        assert metric(samples, "pubsub_publish_rate_limited_total", scope="ip") == 2


def test_a_websocket_flood_of_publishes_gets_only_the_budget_through():
    with limited_broker(20, "/flood") as (b, listener, ws):
        started = time.monotonic()
        frames = 2000
        for i in range(frames):
            ws.send({"channel": "/flood", "data": i, "id": str(i)})
        answered, accepted = 0, 0
        while answered < frames:
            for m in ws.recv(30):
                answered += 1
                if m["successful"]:
                    accepted += 1
                else:
                    assert m["error"].startswith("429:/flood,"), m
        elapsed = time.monotonic() - started
        # The burst of 20, and what refilled meanwhile (20 per 60 s).
        assert 20 <= accepted <= 20 + int(elapsed / 3) + 1, (accepted, elapsed)
        got = delivered(b, listener, "/flood", accepted)
        assert len(got) == accepted and got == sorted(got)
        assert metric(scrape(f"http://127.0.0.1:{b.port}/metrics"), "pubsub_publish_rate_limited_total",
                      scope="ip") == frames - accepted
        assert b.alive()


def test_a_batch_larger_than_what_is_left_is_refused_whole():
    with Broker(timeout=5, extra_args=["--publish-limit-per-ip", "5", "--publish-limit-window", "10"]) as b:
        status, headers, _ = raw_request(b.port, [{"channel": "/x", "data": i} for i in range(3)])
        assert status == 200 and headers["x-ratelimit-remaining"] == "2"
        status, headers, _ = raw_request(b.port, [{"channel": "/x", "data": i} for i in range(3)])
        assert status == 429 and headers["x-ratelimit-remaining"] == "2" and headers["retry-after"] == "2"
        # Nothing was spent by the refusal: two single publishes still pass.
        for remaining in (1, 0):
            status, headers, _ = raw_request(b.port, [{"channel": "/x", "data": 0}])
            assert status == 200 and headers["x-ratelimit-remaining"] == str(remaining)


def test_per_token_publish_limit_counts_each_token_apart():
    args = ["--publish-limit-per-token", "2", "--publish-limit-window", "60"]
    with Broker(timeout=5, extra_args=args) as b:
        def pub(token=None, ext_token=None):
            msg = {"channel": "/x", "data": 1}
            if ext_token:
                msg["ext"] = {"token": ext_token}
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return raw_request(b.port, [msg], headers=headers)

        assert pub(token="alpha")[1]["x-ratelimit-remaining"] == "1"
        assert pub(ext_token="alpha")[1]["x-ratelimit-remaining"] == "0"
        status, headers, text = pub(token="alpha")
        assert status == 429 and "per publish token" in text
        assert headers["retry-after"] == "30" and headers["x-ratelimit-reset"] == "60"
        # Another token, and requests without a token (no per-IP limit set), are unaffected.
        status, headers, _ = pub(token="beta")
        assert status == 200 and headers["x-ratelimit-remaining"] == "1"
        for _ in range(5):
            status, headers, _ = pub()
            assert status == 200 and "x-ratelimit-limit" not in headers


def test_both_limits_apply_and_headers_show_the_tighter():
    args = ["--publish-limit-per-ip", "10", "--publish-limit-per-token", "2", "--publish-limit-window", "60"]
    with Broker(timeout=5, extra_args=args) as b:
        status, headers, _ = raw_request(b.port, [{"channel": "/x", "data": 1}], headers={"Authorization": "Bearer t"})
        assert status == 200 and headers["x-ratelimit-limit"] == "2" and headers["x-ratelimit-remaining"] == "1"
        status, headers, _ = raw_request(b.port, [{"channel": "/x", "data": 1}])
        assert status == 200 and headers["x-ratelimit-limit"] == "10" and headers["x-ratelimit-remaining"] == "8"


def test_forwarded_for_is_used_only_when_trusted():
    args = ["--publish-limit-per-ip", "1", "--publish-limit-window", "60"]
    with Broker(timeout=5, extra_args=args + ["--trust-forwarded-for"]) as b:
        for client in ("203.0.113.1", "203.0.113.2"):
            status, _, _ = raw_request(b.port, [{"channel": "/x", "data": 1}],
                                       headers={"X-Forwarded-For": f"10.9.9.9, {client}"})
            assert status == 200
        status, _, _ = raw_request(b.port, [{"channel": "/x", "data": 1}],
                                   headers={"X-Forwarded-For": "10.9.9.9, 203.0.113.1"})
        assert status == 429
    with Broker(timeout=5, extra_args=args) as b:
        assert raw_request(b.port, [{"channel": "/x", "data": 1}], headers={"X-Forwarded-For": "1.1.1.1"})[0] == 200
        assert raw_request(b.port, [{"channel": "/x", "data": 1}], headers={"X-Forwarded-For": "2.2.2.2"})[0] == 429


# ---------------------------------------------------------------- per-client limits

def test_queue_limit_drops_only_the_slow_client():
    with Broker(timeout=5, extra_args=["--max-queue", "3"]) as b:
        slow, fast = handshake(b.url), handshake(b.url)
        for cid in (slow, fast):
            subscribe(b.url, cid, "/q")
        connect(b.url, fast)
        for i in range(5):
            publish(b.url, "/q", {"i": i})
            events = [m for m in connect(b.url, fast) if m.get("channel") == "/q"]
            assert [e["data"]["i"] for e in events] == [i]
        reply = connect(b.url, slow)
        assert reply[0]["successful"] is False and reply[0]["error"].startswith("409:")
        assert reply[0]["advice"] == {"reconnect": "handshake"}


def test_subscription_limit_refuses_with_an_error_and_spares_others():
    with Broker(timeout=5, extra_args=["--max-subscriptions", "2"]) as b:
        cid, other = handshake(b.url), handshake(b.url)
        subscribe(b.url, cid, "/a")
        subscribe(b.url, cid, "/b")
        reply = bayeux(b.url, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/c"}])
        assert reply[0]["successful"] is False and reply[0]["error"].startswith("403:"), reply
        for channel in ("/a", "/b"):
            subscribe(b.url, other, channel)


def test_request_and_frame_size_limits_answer_413_and_1009_and_spare_others():
    args = ["--max-request-bytes", "2000", "--max-frame-bytes", "2000"]
    with Broker(timeout=5, extra_args=args) as b:
        big = [{"channel": "/x", "data": "y" * 3000}]
        r = requests.post(b.url, data=json.dumps(big), headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 413 and "limit 2000 bytes" in r.text
        ws = websocket.create_connection(b.ws_url, timeout=10)
        ws.send(json.dumps(big))
        ws.settimeout(5)
        frame = ws.recv_frame()
        assert frame.opcode == websocket.ABNF.OPCODE_CLOSE and int.from_bytes(frame.data[:2], "big") == 1009
        ws.close()
        handshake(b.url)
        publish(b.url, "/x", {"small": True})


def test_pubsub_publish_backs_off_on_429_and_delivers_everything():
    import subprocess
    from opshelp import metric, pubsub_bin, scrape
    args = ["--publish-limit-per-ip", "2", "--publish-limit-window", "2"]
    with Broker(timeout=5, extra_args=args) as b:
        cid = handshake(b.url)
        subscribe(b.url, cid, "/jobs")
        lines = "".join(json.dumps({"n": i}) + "\n" for i in range(5))
        t0 = time.monotonic()
        result = subprocess.run([pubsub_bin(), "publish", "--url", b.url, "--lines", "--batch-size", "1", "/jobs"],
                                input=lines, capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - t0
        assert result.returncode == 0, result.stderr
        # Two go at once, then one a second: the client waited as told instead of failing.
        assert elapsed >= 1.5, elapsed
        assert metric(scrape(f"http://127.0.0.1:{b.port}/metrics"), "pubsub_publish_rate_limited_total",
                      scope="ip") >= 1
        events = [m["data"]["n"] for m in connect(b.url, cid) if m.get("channel") == "/jobs"]
        assert events == [0, 1, 2, 3, 4]
