"""The server API (`/api`) on the memory engine, against the real binary: each call, each error, kick."""

import re
import socket
import time
from datetime import datetime, timezone

import pytest
import requests

from apikit import APIBroker, api_broker, api_handshake, api_subscribe, bayeux, new_key, parked_connect
from pubsubtest.bayeux import connect
from pubsubtest.broker import Broker
from pubsubtest.wait import wait_until
from pubsubtest.websocket import BayeuxWebSocket

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


# ------------------------------------------------------------------ keys

def test_without_a_key_api_and_admin_are_not_found():
    with Broker(target="pubsub") as b:
        base = f"http://127.0.0.1:{b.port}"
        for path in ("/api/info", "/api/channels", "/admin"):
            r = requests.get(base + path, headers={"Authorization": "apikey whatever-key-0123456789"}, timeout=5)
            assert r.status_code == 404, path
        r = requests.post(base + "/api/publish", json={"channel": "/a", "data": 1}, timeout=5)
        assert r.status_code == 404


def test_missing_or_wrong_key_is_401_and_never_echoed(api_broker):
    b = api_broker
    for key in ("", "wrong-" + b.key[6:], b.key + "x", b.key[:-1]):
        r = b.api("GET", "info", key=key)
        assert r.status_code == 401, key
        assert r.json() == {"error": r.json()["error"]} and r.json()["error"]
        assert b.key not in r.text
    r = b.api("GET", "info", headers={"Authorization": f"Bearer {b.key}"})
    assert r.status_code == 401
    r = requests.get(f"{b.base}/admin", timeout=5)
    assert r.status_code == 401 and b.key not in r.text
    r = requests.get(f"{b.base}/admin", headers={"Authorization": f"apikey {b.key}"}, timeout=5)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert b.ok("GET", "info")["clients"] == 0
    r = b.api("GET", "info", headers={"Origin": "http://evil.example"})
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
    r = b.http.options(f"{b.base}/api/info", headers={"Origin": "http://evil.example",
                                                      "Access-Control-Request-Method": "GET",
                                                      "Access-Control-Request-Headers": "authorization"}, timeout=5)
    assert "Access-Control-Allow-Origin" not in r.headers and "Access-Control-Allow-Headers" not in r.headers


def test_repeated_wrong_keys_from_one_address_get_429_until_the_minute_ends():
    """A key cannot be guessed at wire speed: the 11th try from one address within a minute is answered 429 with
    Retry-After, right key or not; another address (behind a trusted proxy) is unaffected; both are counted."""
    with APIBroker(extra_args=("--trust-forwarded-for",), timeout=5) as b:
        guesser = {"X-Forwarded-For": "203.0.113.7"}
        for k in range(10):
            r = b.api("GET", "info", key=f"guess-{k:032d}", headers=guesser)
            assert r.status_code == 401, (k, r.status_code)
        for key in ("guess-next-000000000000000000000", b.key):
            r = b.api("GET", "info", key=key, headers=guesser)
            assert r.status_code == 429, (key, r.status_code, r.text)
            assert r.json()["error"] and b.key not in r.text
            assert 1 <= int(r.headers["Retry-After"]) <= 60
        assert b.api("GET", "info", headers={"X-Forwarded-For": "198.51.100.1"}).status_code == 200
        metrics = requests.get(f"{b.base}/metrics", timeout=5).text
        assert 'pubsub_api_auth_refused_total{reason="wrong_key"} 10' in metrics, metrics
        assert 'pubsub_api_auth_refused_total{reason="throttled"} 2' in metrics


def test_short_key_is_refused_on_the_command_line():
    from pubsubtest.broker import pubsub_bin
    import subprocess
    p = subprocess.run([pubsub_bin(), "serve", "--port", "0", "--api-key", "short"], capture_output=True,
                       timeout=20)
    assert p.returncode != 0
    assert b"--api-key" in p.stderr


def test_unknown_call_wrong_method_bad_body(api_broker):
    b = api_broker
    r = b.api("GET", "nothing-here")
    assert r.status_code == 404 and "error" in r.json()
    r = b.api("GET", "publish")
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    r = b.api("POST", "channels", json_body={})
    assert r.status_code == 405
    r = b.api("POST", "publish", data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("invalid JSON")
    r = b.api("POST", "publish", data=b"[1,2]", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "object" in r.json()["error"]
    r = b.api("POST", "publish")
    assert r.status_code == 400
    for body, fragment in (({"channel": "/a/*", "data": 1}, "invalid channel"),
                           ({"channel": "/meta/handshake", "data": 1}, "meta"),
                           ({"channel": "/service/x", "data": 1}, "service"),
                           ({"channel": 5, "data": 1}, "channel"),
                           ({"channel": "/a"}, "data"),
                           ({"channel": "/a", "data": None}, "data"),
                           ({"channel": "/a", "data": 1, "ext": [1]}, "ext")):
        r = b.api("POST", "publish", json_body=body)
        assert r.status_code == 400, body
        assert fragment in r.json()["error"], (body, r.json())


def test_request_body_is_bounded():
    with APIBroker(extra_args=("--max-request-bytes", "200")) as b:
        r = b.api("POST", "publish", json_body={"channel": "/a", "data": "x" * 400})
        assert r.status_code == 413
        r = b.api("POST", "publish", json_body={"channel": "/a", "data": "x"})
        assert r.status_code == 200


# ------------------------------------------------------------------ publish and broadcast

def test_publish_reaches_a_subscriber_with_its_position(api_broker):
    b = api_broker
    cid = api_handshake(b)
    api_subscribe(b, cid, "/jobs/*")
    t, box = parked_connect(b, cid)
    answer = b.ok("POST", "publish", json_body={"channel": "/jobs/42", "data": {"done": True}, "ext": {"k": 1}})
    t.join(10)
    events = [m for m in box[0] if m.get("channel") == "/jobs/42"]
    assert len(events) == 1
    assert events[0]["data"] == {"done": True}
    assert events[0]["ext"]["k"] == 1
    assert answer["position"] == events[0]["ext"]["position"]
    assert "clientId" not in events[0]


def test_publish_without_history_answers_a_null_position():
    with APIBroker(extra_args=("--history-size", "0")) as b:
        assert b.ok("POST", "publish", json_body={"channel": "/a", "data": 1}) == {"position": None}


def test_broadcast_reaches_each_channel_once(api_broker):
    b = api_broker
    one, two = api_handshake(b), api_handshake(b)
    api_subscribe(b, one, "/a")
    api_subscribe(b, two, "/b")
    t1, box1 = parked_connect(b, one)
    t2, box2 = parked_connect(b, two)
    answer = b.ok("POST", "broadcast", json_body={"channels": ["/a", "/b"], "data": "hello"})
    t1.join(10)
    t2.join(10)
    assert [r["channel"] for r in answer["results"]] == ["/a", "/b"]
    got1 = [m for m in box1[0] if m.get("channel") == "/a"]
    got2 = [m for m in box2[0] if m.get("channel") == "/b"]
    assert got1[0]["data"] == got2[0]["data"] == "hello"
    assert answer["results"][0]["position"] == got1[0]["ext"]["position"]
    assert answer["results"][1]["position"] == got2[0]["ext"]["position"]
    r = b.api("POST", "broadcast", json_body={"channels": ["/ok", "/bad/*"], "data": 1})
    assert r.status_code == 400 and "/bad/*" in r.json()["error"]
    r = b.api("POST", "broadcast", json_body={"channels": [], "data": 1})
    assert r.status_code == 400


# ------------------------------------------------------------------ channels and presence

def test_channels_count_subscribers_and_follow_changes(api_broker):
    b = api_broker
    assert b.ok("GET", "channels") == {"channels": []}
    a, c, d = api_handshake(b), api_handshake(b), api_handshake(b)
    api_subscribe(b, a, "/jobs/1", "/jobs/**")
    api_subscribe(b, c, "/jobs/1")
    api_subscribe(b, d, "/chat/room")
    got = {e["channel"]: e["subscribers"] for e in b.ok("GET", "channels")["channels"]}
    assert got == {"/jobs/1": 2, "/jobs/**": 1, "/chat/room": 1}
    only = b.ok("GET", "channels", params={"pattern": "/jobs/**"})["channels"]
    assert {e["channel"] for e in only} == {"/jobs/1", "/jobs/**"}
    assert b.api("GET", "channels", params={"pattern": "no-slash"}).status_code == 400
    bayeux(b, [{"channel": "/meta/unsubscribe", "clientId": c, "subscription": "/jobs/1"}])
    bayeux(b, [{"channel": "/meta/disconnect", "clientId": d}])
    got = {e["channel"]: e["subscribers"] for e in b.ok("GET", "channels")["channels"]}
    assert got == {"/jobs/1": 1, "/jobs/**": 1}


def test_presence_lists_clients_with_transport_and_since(api_broker):
    b = api_broker
    before = datetime.now(timezone.utc).timestamp()
    lp = api_handshake(b)
    api_subscribe(b, lp, "/chat/room")
    with BayeuxWebSocket(b) as ws:
        wid = ws.handshake()
        ws.send([{"channel": "/meta/subscribe", "clientId": wid, "subscription": "/chat/room"},
                 {"channel": "/meta/connect", "clientId": wid, "connectionType": "websocket"}])
        wait_until(lambda: len(b.ok("GET", "presence", params={"channel": "/chat/room"})["clients"]) == 2)
        answer = wait_until(lambda: (lambda a: a if all(c["transport"] for c in a["clients"]) else None)(
            b.ok("GET", "presence", params={"channel": "/chat/room"})))
        assert answer["channel"] == "/chat/room"
        by_id = {c["clientId"]: c for c in answer["clients"]}
        assert set(by_id) == {lp, wid}
        assert by_id[lp]["transport"] == "long-polling"
        assert by_id[wid]["transport"] == "websocket"
        for c in answer["clients"]:
            assert c["user"] is None
            assert ISO.match(c["since"]), c
            at = datetime.strptime(c["since"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
            assert before - 1 <= at <= time.time() + 1
        assert b.ok("GET", "presence", params={"channel": "/chat/other"}) == {"channel": "/chat/other", "clients": []}
        assert b.api("GET", "presence").status_code == 400


# ------------------------------------------------------------------ disconnect (kick)

def test_kick_answers_the_parked_connect_with_reconnect_none(api_broker):
    b = api_broker
    cid = api_handshake(b)
    api_subscribe(b, cid, "/room")
    t, box = parked_connect(b, cid)
    assert b.ok("POST", "disconnect", json_body={"clientId": cid}) == {"disconnected": True}
    t.join(5)
    assert box, "the parked connect was not answered"
    reply = [m for m in box[0] if m.get("channel") == "/meta/connect"][0]
    assert reply["successful"] is False
    assert reply["advice"] == {"reconnect": "none"}
    assert reply["error"].startswith("401:")
    assert b.ok("GET", "presence", params={"channel": "/room"})["clients"] == []
    assert b.ok("POST", "disconnect", json_body={"clientId": cid}) == {"disconnected": False}
    assert b.api("POST", "disconnect", json_body={}).status_code == 400


def test_a_client_kicked_between_polls_is_told_at_its_next_connect(api_broker):
    b = api_broker
    cid = api_handshake(b)
    assert b.ok("POST", "disconnect", json_body={"clientId": cid}) == {"disconnected": True}
    reply = [m for m in connect(b, cid) if m.get("channel") == "/meta/connect"][0]
    assert reply["successful"] is False and reply["advice"] == {"reconnect": "none"}
    other = [m for m in connect(b, "nosuchclientnosuchclientnosuchc") if m.get("channel") == "/meta/connect"][0]
    assert other["advice"] == {"reconnect": "handshake"}


def test_kick_over_websocket_answers_then_closes_normally(api_broker):
    b = api_broker
    with BayeuxWebSocket(b) as ws:
        wid = ws.handshake()
        ws.send([{"channel": "/meta/connect", "clientId": wid, "connectionType": "websocket"}])
        assert ws.recv()[0]["channel"] == "/meta/connect"  # the first connect is answered at once
        ws.send([{"channel": "/meta/connect", "clientId": wid, "connectionType": "websocket"}])
        # A socket's frames are handled in order: the answer to a later subscribe means the connect is held.
        ws.send([{"channel": "/meta/subscribe", "clientId": wid, "subscription": "/kick/after"}])
        assert ws.recv()[0]["channel"] == "/meta/subscribe"
        assert b.ok("POST", "disconnect", json_body={"clientId": wid}) == {"disconnected": True}
        reply = ws.recv()
        assert reply[0]["channel"] == "/meta/connect"
        assert reply[0]["advice"] == {"reconnect": "none"}
        assert ws.recv_close() == 1000


# ------------------------------------------------------------------ history

def _positions(b, channel, n, start=0):
    return [b.ok("POST", "publish", json_body={"channel": channel, "data": start + i})["position"]
            for i in range(n)]


def test_history_after_a_position_is_recovered_and_pages(api_broker):
    b = api_broker
    pos = _positions(b, "/h/a", 4)
    _positions(b, "/h/b", 1, start=100)
    answer = b.ok("GET", "history", params={"channel": "/h/a", "since": pos[0]})
    assert answer["recovered"] is True
    assert [m["data"] for m in answer["messages"]] == [1, 2, 3]
    assert [m["position"] for m in answer["messages"]] == pos[1:]
    page = b.ok("GET", "history", params={"channel": "/h/a", "since": pos[0], "limit": 2})
    assert [m["data"] for m in page["messages"]] == [1, 2] and page["more"] is True and page["recovered"]
    rest = b.ok("GET", "history", params={"channel": "/h/a", "since": page["messages"][-1]["position"]})
    assert [m["data"] for m in rest["messages"]] == [3] and "more" not in rest
    both = b.ok("GET", "history", params={"channel": "/h/*", "since": pos[2]})
    assert [m["data"] for m in both["messages"]] == [3, 100]
    everything = b.ok("GET", "history", params={"channel": "/h/a"})
    assert [m["data"] for m in everything["messages"]] == [0, 1, 2, 3] and everything["recovered"] is True
    for bad in ({"channel": "/h/a", "limit": "0"}, {"channel": "/h/a", "limit": "x"}, {}):
        assert b.api("GET", "history", params=bad).status_code == 400


def test_history_is_as_honest_as_resume():
    with APIBroker(extra_args=("--history-size", "3")) as b:
        pos = _positions(b, "/h", 6)
        for token in (pos[0], pos[2], "1.garbage.0", "not-a-position"):
            answer = b.ok("GET", "history", params={"channel": "/h", "since": token})
            cid = api_handshake(b)
            reply = bayeux(b, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/h",
                                "ext": {"resume": token}}])
            resumed = reply[0]["ext"]["resume"]
            assert answer["recovered"] == resumed["recovered"], (token, answer, resumed)
        assert b.ok("GET", "history", params={"channel": "/h", "since": pos[2]})["recovered"] is True
        old = b.ok("GET", "history", params={"channel": "/h", "since": pos[0]})
        assert old["recovered"] is False
        assert [m["data"] for m in old["messages"]] == [3, 4, 5]  # what is still held, a lower bound
        assert b.ok("GET", "history", params={"channel": "/h"})["recovered"] is False


# ------------------------------------------------------------------ info

def test_errors_lists_refused_requests_newest_first(api_broker):
    b = api_broker
    assert b.ok("GET", "errors") == {"errors": []}
    requests.post(b.url, data="{not json", headers={"Content-Type": "application/json"}, timeout=5)
    errors = b.ok("GET", "errors")["errors"]
    assert [e["kind"] for e in errors] == ["bad_request"]
    assert ISO.match(errors[0]["at"])


def test_info_counts_clients_by_transport_and_rates(api_broker):
    b = api_broker
    first = b.ok("GET", "info")
    assert len(first["nodes"]) == 1 and first["clients"] == 0
    a, c = api_handshake(b), api_handshake(b)
    api_subscribe(b, a, "/x", "/y")
    info = b.ok("GET", "info")
    node = info["nodes"][0]
    assert info["clients"] == 2
    assert node["clients"] == {"long-polling": 2}
    assert node["subscriptions"] == 2
    assert isinstance(node["uptimeSeconds"], int) and node["id"]
    for _ in range(20):
        b.ok("POST", "publish", json_body={"channel": "/x", "data": 1})
    rates = wait_until(lambda: (lambda n: n if n["rates"]["publishesPerSecond"] > 0 else None)(
        b.ok("GET", "info")["nodes"][0]), timeout=4)
    assert rates["rates"]["deliveriesPerSecond"] > 0
    series = b.ok("GET", "rates")["series"]
    assert any(p["publishes"] > 0 for p in series)
    bayeux(b, [{"channel": "/meta/disconnect", "clientId": c}])
    assert b.ok("GET", "info")["clients"] == 1


def test_api_also_answers_on_the_metrics_port():
    import socket as s
    with s.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with APIBroker(extra_args=("--metrics-port", str(port))) as b:
        wait_until(lambda: _can_connect(port))
        r = requests.get(f"http://127.0.0.1:{port}/api/info", headers={"Authorization": f"apikey {b.key}"},
                         timeout=5)
        assert r.status_code == 200 and r.json()["clients"] == 0
        r = requests.get(f"http://127.0.0.1:{port}/api/info", timeout=5)
        assert r.status_code == 401
        r = requests.post(f"http://127.0.0.1:{port}/api/publish", json={"channel": "/a", "data": 1},
                          headers={"Authorization": f"apikey {b.key}"}, timeout=5)
        assert r.status_code == 200 and r.json()["position"]


def _can_connect(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
