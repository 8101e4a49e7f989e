"""Wire conformance: PROTOCOL.md section 12 (cases 1-25), the additional WebSocket
checks, and EventSource (section 3.6). Replies are compared exactly as parsed JSON."""

import hashlib
import json
import socket
import time
import urllib.parse

import pytest
import requests

from wirekit import (without_positions, ADVICE_HANDSHAKE, ALL6, ANY_CLIENT_ID, HTTP_TIMEOUT, SHORT_TIMEOUT, WS,
                      EventStream, Pattern, advice_ok, connect_msg, connect_now, handshake,
                      handshake_msg, post, post_raw, publish, start_connect, subscribe,
                      timed_post, wait_parked)
from pubsubtest.broker import Broker, target

pytestmark = pytest.mark.timeout(120)


def poll(b, cid, id="poll"):
    """Non-blocking delivery check: a connect with advice.timeout 0 returns what is queued."""
    return connect_now(b, cid, id)


def ok_connect(b, cid, id):
    return {"id": id, "clientId": cid, "channel": "/meta/connect", "successful": True,
            "advice": advice_ok(b.timeout, b.interval)}


# ------------------------------------------------------------------ handshake (cases 1-4)

def test_01_handshake_ok(broker):
    r = post_raw(broker, [{"channel": "/meta/handshake", "version": "1.0",
                           "supportedConnectionTypes": ["long-polling"], "id": "1"}])
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json; charset=utf-8"
    assert r.headers["Cache-Control"] == "no-cache, no-store"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert int(r.headers["Content-Length"]) == len(r.content)
    assert without_positions(r.json()) == [{"id": "1", "channel": "/meta/handshake", "successful": True, "version": "1.0",
                         "supportedConnectionTypes": ALL6, "clientId": ANY_CLIENT_ID,
                         "advice": {"reconnect": "retry", "interval": 0, "timeout": 45000}}]


def test_01b_handshake_ids_are_distinct(broker):
    ids = {handshake(broker) for _ in range(5)}
    assert len(ids) == 5


def test_01c_handshake_version_2_answered_as_1(broker):
    reply = post(broker, [{"channel": "/meta/handshake", "version": "2.0",
                           "supportedConnectionTypes": ["websocket", "long-polling"], "id": "v2"}])
    assert reply == [{"id": "v2", "channel": "/meta/handshake", "successful": True, "version": "1.0",
                      "supportedConnectionTypes": ALL6, "clientId": ANY_CLIENT_ID,
                      "advice": advice_ok(45)}]


def test_02_single_object_body(broker):
    reply = post(broker, {"channel": "/meta/handshake", "version": "1.0",
                          "supportedConnectionTypes": ["long-polling"], "id": "1"})
    assert reply == [{"id": "1", "channel": "/meta/handshake", "successful": True, "version": "1.0",
                      "supportedConnectionTypes": ALL6, "clientId": ANY_CLIENT_ID,
                      "advice": advice_ok(45)}]


def test_03_handshake_missing_version(broker):
    reply = post(broker, {"channel": "/meta/handshake", "supportedConnectionTypes": ["long-polling"], "id": "2"})
    assert reply == [{"id": "2", "channel": "/meta/handshake", "successful": False, "version": "1.0",
                      "supportedConnectionTypes": ALL6,
                      "error": "402:version:Missing required parameter", "advice": ADVICE_HANDSHAKE}]


def test_03b_handshake_missing_connection_types(broker):
    reply = post(broker, {"channel": "/meta/handshake", "version": "1.0", "id": "2b"})
    assert reply == [{"id": "2b", "channel": "/meta/handshake", "successful": False, "version": "1.0",
                      "supportedConnectionTypes": ALL6,
                      "error": "402:supportedConnectionTypes:Missing required parameter",
                      "advice": ADVICE_HANDSHAKE}]


def test_04_handshake_no_common_type(broker):
    reply = post(broker, [{"channel": "/meta/handshake", "version": "1.0",
                           "supportedConnectionTypes": ["iframe", "flash"], "id": "3"}])
    assert reply == [{"id": "3", "channel": "/meta/handshake", "successful": False, "version": "1.0",
                      "supportedConnectionTypes": ALL6,
                      "error": "301:iframe,flash:Connection types not supported",
                      "advice": ADVICE_HANDSHAKE}]


# ------------------------------------------------------------------ connect (cases 5-12)

def test_05_connect_unknown_client(broker):
    reply = post(broker, [{"channel": "/meta/connect", "clientId": "abc", "connectionType": "long-polling",
                           "id": "4"}])
    assert reply == [{"id": "4", "channel": "/meta/connect", "successful": False,
                      "error": "401:abc:Unknown client", "advice": ADVICE_HANDSHAKE}]


def test_06_connect_missing_type(broker):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/connect", "clientId": cid, "id": "6"}])
    assert reply == [{"id": "6", "channel": "/meta/connect", "successful": False,
                      "error": "402:connectionType:Missing required parameter", "advice": ADVICE_HANDSHAKE}]


def test_06b_connect_missing_client_id(broker):
    reply = post(broker, [{"channel": "/meta/connect", "connectionType": "long-polling", "id": "6b"}])
    assert reply == [{"id": "6b", "channel": "/meta/connect", "successful": False,
                      "error": "402:clientId:Missing required parameter", "advice": ADVICE_HANDSHAKE}]


def test_07_connect_bad_type(broker):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/connect", "clientId": cid, "connectionType": "iframe", "id": "7"}])
    assert reply == [{"id": "7", "channel": "/meta/connect", "successful": False,
                      "error": "301:iframe:Connection types not supported", "advice": ADVICE_HANDSHAKE}]


def test_08_connect_advice_timeout_zero_is_immediate(broker):
    cid = handshake(broker)
    for n in range(2):      # the first connect after the handshake and a later one
        reply, elapsed = timed_post(broker, [{"channel": "/meta/connect", "clientId": cid,
                                              "connectionType": "long-polling", "id": f"8{n}",
                                              "advice": {"timeout": 0}}])
        assert reply == [{"id": f"8{n}", "clientId": cid, "channel": "/meta/connect", "successful": True,
                          "advice": {"reconnect": "retry", "interval": 0, "timeout": 45000}}]
        assert elapsed < 3


def test_09_connect_held_for_timeout(short_broker):
    b = short_broker
    cid = handshake(b)
    connect_now(b, cid)
    reply, elapsed = timed_post(b, [connect_msg(cid, "9")], timeout=SHORT_TIMEOUT + 10)
    assert reply == [{"id": "9", "clientId": cid, "channel": "/meta/connect", "successful": True,
                      "advice": {"reconnect": "retry", "interval": 0, "timeout": SHORT_TIMEOUT * 1000}}]
    assert SHORT_TIMEOUT - 0.5 <= elapsed <= SHORT_TIMEOUT + 2.5, elapsed


def test_09b_client_advice_timeout_sets_the_hold(broker):
    cid = handshake(broker)
    connect_now(broker, cid)
    reply, elapsed = timed_post(broker, [connect_msg(cid, "9b", advice_timeout=1500)])
    assert reply == [ok_connect(broker, cid, "9b")]
    assert 1.0 <= elapsed <= 4.0, elapsed


def test_10_parked_connect_released_by_publish(broker, pool):
    cid = handshake(broker)
    subscribe(broker, cid, "/foo/bar")
    connect_now(broker, cid)
    fut = start_connect(pool, broker, cid, "25")
    wait_parked(broker)
    assert not fut.done(), "connect was not held"
    reply = post(broker, [{"channel": "/foo/bar", "data": {"hello": "world"}, "clientId": cid, "id": "18",
                           "ext": {"token": "x"}}])
    assert reply == [{"id": "18", "clientId": cid, "channel": "/foo/bar", "successful": True}]
    t0 = time.monotonic()
    got, _ = fut.result(timeout=10)
    assert time.monotonic() - t0 < 3
    assert got == [ok_connect(broker, cid, "25"),
                   {"channel": "/foo/bar", "data": {"hello": "world"}, "id": "18", "ext": {"token": "x"}}]


def test_11_queued_events_returned_in_order(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/q/order")
    connect_now(broker, cid)
    for n in range(5):
        publish(broker, "/q/order", {"n": n}, id=f"o{n}")
    events = poll(broker, cid)
    assert events == [{"channel": "/q/order", "data": {"n": n}, "id": f"o{n}"} for n in range(5)]
    assert poll(broker, cid, "poll2") == []


def test_12_connect_eventsource(broker):
    cid = handshake(broker)
    reply, elapsed = timed_post(broker, [connect_msg(cid, "12", ctype="eventsource")])
    assert reply == [{"id": "12", "clientId": cid, "channel": "/meta/connect", "successful": True,
                      "advice": {"reconnect": "retry", "interval": 45000, "timeout": 0}}]
    assert elapsed < 3


# ------------------------------------------------------------------ subscribe / unsubscribe (13-17)

def test_13_subscribe_array_and_routing(broker):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/subscribe", "clientId": cid,
                           "subscription": ["/a/b", "/a/*", "/x/**"], "id": "10"}])
    assert reply == [{"id": "10", "clientId": cid, "channel": "/meta/subscribe", "successful": True,
                      "subscription": ["/a/b", "/a/*", "/x/**"]}]
    connect_now(broker, cid)
    for ch, n in [("/a/b/c", 1), ("/a/zz", 2), ("/x/y/z", 3), ("/a", 4), ("/x", 5), ("/a/b", 6), ("/x/y", 7)]:
        publish(broker, ch, n, id=f"r{n}")
    # /a/b is matched by both /a/b and /a/*: delivered once.
    assert poll(broker, cid) == [{"channel": "/a/zz", "data": 2, "id": "r2"},
                                 {"channel": "/x/y/z", "data": 3, "id": "r3"},
                                 {"channel": "/a/b", "data": 6, "id": "r6"},
                                 {"channel": "/x/y", "data": 7, "id": "r7"}]


def test_13b_catch_all_patterns(broker):
    cid = handshake(broker)
    subscribe(broker, cid, ["/*", "/**"])
    connect_now(broker, cid)
    publish(broker, "/top", 1, id="t1")
    publish(broker, "/deep/er/still", 2, id="t2")
    publish(broker, "/service/svc", 3, id="t3")
    assert poll(broker, cid) == [{"channel": "/top", "data": 1, "id": "t1"},
                                 {"channel": "/deep/er/still", "data": 2, "id": "t2"},
                                 {"channel": "/service/svc", "data": 3, "id": "t3"}]


def test_13c_event_keeps_unknown_fields_and_drops_client_id(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/fields")
    connect_now(broker, cid)
    reply = post(broker, [{"channel": "/fields", "data": [1, "two", None, {"x": 1.5}], "clientId": "someone",
                           "id": "f1", "ext": {"e": True}, "custom": {"k": "v"}}])
    assert reply == [{"id": "f1", "clientId": "someone", "channel": "/fields", "successful": True}]
    assert poll(broker, cid) == [{"channel": "/fields", "data": [1, "two", None, {"x": 1.5}], "id": "f1",
                                  "ext": {"e": True}, "custom": {"k": "v"}}]


@pytest.mark.parametrize("channel", ["/meta/foo", "/service/foo", "/meta/**", "/service/**"])
def test_14_subscribe_forbidden(broker, channel):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": channel, "id": "12"}])
    assert reply == [{"id": "12", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                      "subscription": channel, "error": f"403:{channel}:Forbidden channel"}]


def test_14b_metadata_is_not_meta(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/metadata/x")


@pytest.mark.parametrize("channel", ["foo", "/foo/*/bar", "/", "/a/", "//a", "/a b/c", "/a.b", "/\u00e9"])
def test_15_subscribe_invalid(broker, channel):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": channel, "id": "15"}])
    assert reply == [{"id": "15", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                      "subscription": channel, "error": f"405:{channel}:Invalid channel"}]


def test_15b_subscribe_array_stops_at_first_error_without_rollback(broker):
    cid = handshake(broker)
    subs = ["/ok/1", "bad", "/ok/2"]
    reply = post(broker, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": subs, "id": "15b"}])
    assert reply == [{"id": "15b", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                      "subscription": subs, "error": "405:bad:Invalid channel"}]
    connect_now(broker, cid)
    publish(broker, "/ok/1", 1, id="k1")
    publish(broker, "/ok/2", 2, id="k2")
    assert poll(broker, cid) == [{"channel": "/ok/1", "data": 1, "id": "k1"}]


def test_15c_invalid_overrides_forbidden(broker):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/meta/*/x", "id": "15c"}])
    assert reply == [{"id": "15c", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                      "subscription": "/meta/*/x", "error": "405:/meta/*/x:Invalid channel"}]


def test_16_subscribe_missing_subscription(broker):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/subscribe", "clientId": cid, "id": "14"}])
    assert reply == [{"id": "14", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                      "error": "402:subscription:Missing required parameter", "subscription": []}]


def test_16b_subscribe_unknown_client(broker):
    reply = post(broker, [{"channel": "/meta/subscribe", "clientId": "nope", "subscription": "/a", "id": "16"}])
    assert reply == [{"id": "16", "clientId": "nope", "channel": "/meta/subscribe", "successful": False,
                      "error": "401:nope:Unknown client", "subscription": "/a"}]


def test_16c_subscribe_empty_array(broker):
    cid = handshake(broker)
    subscribe(broker, cid, [])


def test_16d_subscribe_twice_is_idempotent(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/twice", id="s1")
    subscribe(broker, cid, "/twice", id="s2")
    connect_now(broker, cid)
    publish(broker, "/twice", 1, id="tw")
    assert poll(broker, cid) == [{"channel": "/twice", "data": 1, "id": "tw"}]


def test_17_unsubscribe_never_subscribed(broker):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/unsubscribe", "clientId": cid, "subscription": "/never", "id": "17"}])
    assert reply == [{"id": "17", "clientId": cid, "channel": "/meta/unsubscribe", "successful": True,
                      "subscription": "/never"}]


def test_17b_unsubscribe_stops_delivery(broker):
    cid = handshake(broker)
    subscribe(broker, cid, ["/u/1", "/u/2"])
    reply = post(broker, [{"channel": "/meta/unsubscribe", "clientId": cid, "subscription": ["/u/1"], "id": "17b"}])
    assert reply == [{"id": "17b", "clientId": cid, "channel": "/meta/unsubscribe", "successful": True,
                      "subscription": ["/u/1"]}]
    connect_now(broker, cid)
    publish(broker, "/u/1", 1, id="u1")
    publish(broker, "/u/2", 2, id="u2")
    assert poll(broker, cid) == [{"channel": "/u/2", "data": 2, "id": "u2"}]


def test_17c_unsubscribe_errors(broker):
    cid = handshake(broker)
    assert post(broker, [{"channel": "/meta/unsubscribe", "clientId": cid, "id": "a"},
                         {"channel": "/meta/unsubscribe", "clientId": "nope", "subscription": "/x", "id": "b"},
                         {"channel": "/meta/unsubscribe", "clientId": cid, "subscription": "/meta/x", "id": "c"},
                         {"channel": "/meta/unsubscribe", "clientId": cid, "subscription": "x", "id": "d"}]) == [
        {"id": "a", "clientId": cid, "channel": "/meta/unsubscribe", "successful": False,
         "error": "402:subscription:Missing required parameter", "subscription": []},
        {"id": "b", "clientId": "nope", "channel": "/meta/unsubscribe", "successful": False,
         "error": "401:nope:Unknown client", "subscription": "/x"},
        {"id": "c", "clientId": cid, "channel": "/meta/unsubscribe", "successful": False,
         "error": "403:/meta/x:Forbidden channel", "subscription": "/meta/x"},
        {"id": "d", "clientId": cid, "channel": "/meta/unsubscribe", "successful": False,
         "error": "405:x:Invalid channel", "subscription": "x"}]


# ------------------------------------------------------------------ publish (18-19)

def test_18_publish_without_client_id(broker):
    reply = post(broker, [{"channel": "/foo/bar", "data": "x", "id": "19"}])
    assert reply == [{"id": "19", "channel": "/foo/bar", "successful": True}]


def test_18b_publish_with_bogus_client_id(broker):
    reply = post(broker, [{"channel": "/foo/bar", "data": "x", "clientId": "bogus", "id": "19b"}])
    assert reply == [{"id": "19b", "clientId": "bogus", "channel": "/foo/bar", "successful": True}]


def test_18c_publisher_receives_its_own_event(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/echo")
    connect_now(broker, cid)
    publish(broker, "/echo", "me", id="me", clientId=cid)
    assert poll(broker, cid) == [{"channel": "/echo", "data": "me", "id": "me"}]


@pytest.mark.parametrize("message,expected", [
    ({"channel": "/foo/bar", "id": "20"},
     {"id": "20", "channel": "/foo/bar", "successful": False, "error": "402:data:Missing required parameter"}),
    ({"channel": "/foo/*", "data": 1, "id": "22"},
     {"id": "22", "channel": "/foo/*", "successful": False, "error": "405:/foo/*:Invalid channel"}),
    ({"channel": "/foo/**", "data": 1, "id": "22b"},
     {"id": "22b", "channel": "/foo/**", "successful": False, "error": "405:/foo/**:Invalid channel"}),
    ({"data": 1, "id": "24"},
     {"id": "24", "successful": False, "error": "405::Invalid channel"}),
    ({"channel": "/a.b", "data": 1, "id": "25"},
     {"id": "25", "channel": "/a.b", "successful": False, "error": "405:/a.b:Invalid channel"}),
    ({"channel": "/a", "data": None, "id": "26"},
     {"id": "26", "channel": "/a", "successful": False, "error": "402:data:Missing required parameter"}),
], ids=["no-data", "pattern", "globstar", "no-channel", "dot", "null-data"])
def test_19_publish_errors(broker, message, expected):
    assert post(broker, [message]) == [expected]


def test_19b_valid_channel_names(broker):
    cid = handshake(broker)
    names = ["/foo", "/foo-bar/(x)", "/a/@!~()$", "/A_z/0-9"]
    subscribe(broker, cid, names)
    connect_now(broker, cid)
    for i, ch in enumerate(names):
        publish(broker, ch, i, id=f"v{i}")
    assert poll(broker, cid) == [{"channel": ch, "data": i, "id": f"v{i}"} for i, ch in enumerate(names)]


def test_19c_publish_reply_order_follows_message_order(broker):
    msgs = [{"channel": f"/order/{n}", "data": n, "id": f"m{n}"} for n in range(10)]
    assert post(broker, msgs) == [{"id": f"m{n}", "channel": f"/order/{n}", "successful": True}
                                  for n in range(10)]


# ------------------------------------------------------------------ meta matching, disconnect (20-21)

def test_20_exact_meta_channel_matching(broker):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/subscribe/x", "clientId": cid, "subscription": "/zzz", "id": "20"}])
    assert reply == [{"id": "20", "clientId": cid, "channel": "/meta/subscribe/x", "successful": False,
                      "error": "403:/meta/subscribe/x:Forbidden channel"}]
    connect_now(broker, cid)
    publish(broker, "/zzz", 1, id="z")
    assert poll(broker, cid) == []


@pytest.mark.parametrize("channel", ["/meta/foo", "/meta/connect/x", "/meta/handshakes", "/meta/Subscribe"])
def test_20b_unknown_meta_channels_forbidden(broker, channel):
    reply = post(broker, [{"channel": channel, "id": "20b"}])
    assert reply == [{"id": "20b", "channel": channel, "successful": False,
                      "error": f"403:{channel}:Forbidden channel"}]


def test_21_disconnect(broker):
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/meta/disconnect", "clientId": cid, "id": "30"}])
    assert reply == [{"id": "30", "clientId": cid, "channel": "/meta/disconnect", "successful": True}]
    reply = post(broker, [{"channel": "/meta/disconnect", "clientId": cid, "id": "31"}])
    assert reply == [{"id": "31", "channel": "/meta/disconnect", "successful": False,
                      "error": f"401:{cid}:Unknown client"}]
    reply = post(broker, [connect_msg(cid, "32", advice_timeout=0)])
    assert reply == [{"id": "32", "channel": "/meta/connect", "successful": False,
                      "error": f"401:{cid}:Unknown client", "advice": ADVICE_HANDSHAKE}]


def test_21b_disconnect_missing_client_id(broker):
    reply = post(broker, [{"channel": "/meta/disconnect", "id": "33"}])
    assert reply == [{"id": "33", "channel": "/meta/disconnect", "successful": False,
                      "error": "402:clientId:Missing required parameter"}]


def test_21c_disconnect_releases_parked_connect(broker, pool):
    cid = handshake(broker)
    subscribe(broker, cid, "/gone")
    connect_now(broker, cid)
    fut = start_connect(pool, broker, cid, "held")
    wait_parked(broker)
    assert not fut.done(), "connect was not held"
    reply = post(broker, [{"channel": "/meta/disconnect", "clientId": cid, "id": "34"}])
    assert reply == [{"id": "34", "clientId": cid, "channel": "/meta/disconnect", "successful": True}]
    got, _ = fut.result(timeout=5)
    assert got == [ok_connect(broker, cid, "held")]


def test_21d_disconnect_drops_subscriptions(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/dropped")
    post(broker, [{"channel": "/meta/disconnect", "clientId": cid, "id": "35"}])
    publish(broker, "/dropped", 1, id="d1")
    reply = post(broker, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/dropped", "id": "36"}])
    assert reply == [{"id": "36", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                      "error": f"401:{cid}:Unknown client", "subscription": "/dropped"}]


# ------------------------------------------------------------------ expiry (22)

def test_22_session_expiry(short_broker):
    b = short_broker
    t = SHORT_TIMEOUT
    cid = handshake(b)
    time.sleep(t * 2 - 1.0)          # still inside 2T after the handshake
    connect_now(b, cid, "alive1")
    time.sleep(t * 2 - 1.0)          # 2T-1 after that connect, > 2T after the handshake
    connect_now(b, cid, "alive2")
    time.sleep(t * 2 + 1.5)          # now past 2T since the last connect
    reply = post(b, [connect_msg(cid, "dead", advice_timeout=0)])
    assert reply == [{"id": "dead", "channel": "/meta/connect", "successful": False,
                      "error": f"401:{cid}:Unknown client", "advice": ADVICE_HANDSHAKE}]


def test_22b_subscribe_does_not_keep_a_session_alive(short_broker):
    b = short_broker
    t = SHORT_TIMEOUT
    cid = handshake(b)
    subscribe(b, cid, "/keep/0", id="k0")
    deadline = time.monotonic() + t * 2 + 1.5
    n = 1
    while time.monotonic() < deadline:   # replies not checked: the session ends meanwhile
        post(b, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": f"/keep/{n}", "id": f"k{n}"},
                 {"channel": "/keep/0", "data": n, "clientId": cid}])
        n += 1
        time.sleep(0.5)
    reply = post(b, [connect_msg(cid, "dead", advice_timeout=0)])
    assert reply == [{"id": "dead", "channel": "/meta/connect", "successful": False,
                      "error": f"401:{cid}:Unknown client", "advice": ADVICE_HANDSHAKE}]


# ------------------------------------------------------------------ JSON-P (23)

def _jsonp_get(b, params, **kw):
    return requests.get(b.url, params=params, timeout=HTTP_TIMEOUT, **kw)


def test_23_jsonp(broker):
    r = _jsonp_get(broker, {"message": '{"channel":"/foo","data":1}'})
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert r.headers["Content-Disposition"] == "attachment; filename=f.txt"
    assert r.headers["Cache-Control"] == "no-cache, no-store"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.text == '/**/jsonpcallback([{"channel":"/foo","successful":true}]);'


def test_23b_jsonp_named_callback_handshake(broker):
    msg = json.dumps([handshake_msg("1", ("callback-polling",))])
    r = _jsonp_get(broker, {"message": msg, "jsonp": "__jsonp1__"})
    assert r.status_code == 200
    assert r.text.startswith("/**/__jsonp1__(") and r.text.endswith(");")
    reply = without_positions(json.loads(r.text[len("/**/__jsonp1__("):-2]))
    assert reply == [{"id": "1", "channel": "/meta/handshake", "successful": True, "version": "1.0",
                      "supportedConnectionTypes": ALL6, "clientId": ANY_CLIENT_ID, "advice": advice_ok(45)}]


def test_23c_jsonp_escapes_line_separators(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/ls")
    connect_now(broker, cid)
    publish(broker, "/ls", "a\u2028b\u2029c", id="ls")
    msg = json.dumps([connect_msg(cid, "lsc", advice_timeout=0)])
    r = _jsonp_get(broker, {"message": msg})
    assert r.status_code == 200
    assert "\u2028" not in r.text and "\u2029" not in r.text
    assert "\\u2028" in r.text and "\\u2029" in r.text
    reply = without_positions(json.loads(r.text[len("/**/jsonpcallback("):-2]))
    assert reply == [ok_connect(broker, cid, "lsc"), {"channel": "/ls", "data": "a\u2028b\u2029c", "id": "ls"}]


@pytest.mark.parametrize("params", [
    {"message": '{"channel":"/foo","data":1}', "jsonp": "alert(1)"},
    {"message": '{"channel":"/foo","data":1}', "jsonp": "1abc"},
    {},
    {"jsonp": "cb"},
], ids=["bad-callback", "digit-callback", "no-message", "no-message-with-callback"])
def test_23d_jsonp_bad_request(broker, params):
    r = _jsonp_get(broker, params)
    assert r.status_code == 400
    assert r.headers["Content-Type"].split(";")[0] == "text/plain"
    assert r.text == "Bad request"


# ------------------------------------------------------------------ transport errors, forms, CORS (24)

@pytest.mark.parametrize("body", ['"hi"', "1", "{nope", "", "null", "true"])
def test_24_transport_errors(broker, body):
    r = post_raw(broker, body)
    assert r.status_code == 400
    assert r.headers["Content-Type"].split(";")[0] == "text/plain"
    assert r.text == "Bad request"


def test_24b_empty_array(broker):
    r = post_raw(broker, "[]")
    assert r.status_code == 200
    assert r.json() == []


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain;charset=UTF-8", None])
def test_24c_form_body(broker, content_type):
    body = "message=" + urllib.parse.quote(json.dumps({"channel": "/foo", "data": 1, "id": "form"}))
    r = post_raw(broker, body, content_type=content_type)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json; charset=utf-8"
    assert r.json() == [{"id": "form", "channel": "/foo", "successful": True}]


def test_24d_json_with_charset(broker):
    r = post_raw(broker, json.dumps({"channel": "/foo", "data": 1, "id": "cs"}),
                 content_type="application/json; charset=utf-8")
    assert r.status_code == 200
    assert r.json() == [{"id": "cs", "channel": "/foo", "successful": True}]


def test_24e_cors_on_post(broker):
    r = post_raw(broker, {"channel": "/foo", "data": 1, "id": "o"}, headers={"Origin": "http://ex.com"})
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "http://ex.com"
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    assert r.json() == [{"id": "o", "channel": "/foo", "successful": True}]
    r = post_raw(broker, {"channel": "/foo", "data": 1, "id": "p"})
    assert "Access-Control-Allow-Origin" not in r.headers


PREFLIGHT = {
    "Access-Control-Allow-Credentials": "true",
    "Access-Control-Allow-Headers": "Accept, Authorization, Content-Type, Pragma, X-Requested-With",
    "Access-Control-Allow-Methods": "POST, GET",
    "Access-Control-Max-Age": "86400",
}


@pytest.mark.parametrize("headers,origin", [
    ({}, "*"),
    ({"Origin": "http://ex.com"}, "http://ex.com"),
    ({"Referer": "http://ref.example/page"}, "http://ref.example/page"),
], ids=["none", "origin", "referer"])
def test_24f_cors_preflight(broker, headers, origin):
    r = requests.options(broker.url, headers=headers, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200
    for k, v in PREFLIGHT.items():
        assert r.headers.get(k) == v, (k, r.headers)
    assert r.headers.get("Access-Control-Allow-Origin") == origin
    assert r.content == b""


def test_24g_preflight_by_request_method_header(broker):
    r = post_raw(broker, {"channel": "/foo", "data": 1}, headers={"Access-Control-Request-Method": "POST",
                                                                  "Origin": "http://ex.com"})
    assert r.status_code == 200
    assert r.headers.get("Access-Control-Allow-Origin") == "http://ex.com"
    assert r.headers.get("Access-Control-Max-Age") == "86400"
    assert r.content == b""


def test_24h_url_routing(broker):
    base = broker.url
    for path in ["/", "/anything"]:
        r = post_raw(broker, {"channel": "/foo", "data": 1, "id": "route"}, path=path)
        assert r.status_code == 200, path
        assert r.json() == [{"id": "route", "channel": "/foo", "successful": True}]
    r = requests.post(base + "X", json={"channel": "/foo", "data": 1}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 404
    assert r.headers["Content-Type"].split(";")[0] == "text/plain"
    assert r.text == "Sure you're not looking for /faye ?"


# ------------------------------------------------------------------ PrivatePub (25)

SECRET = "secret"


def sign(channel, ts, secret=SECRET):
    return hashlib.sha1(f"{secret}{channel}{ts}".encode()).hexdigest()


def now_ms():
    return int(round(time.time() * 1000))


@pytest.fixture(scope="module")
def pp_broker():
    with Broker(timeout=45, secret=SECRET, signature_expiration=3600) as b:
        yield b


def pp_subscribe_msg(cid, channel, ts, sig, id):
    return {"channel": "/meta/subscribe", "clientId": cid, "subscription": channel, "id": id,
            "ext": {"private_pub_signature": sig, "private_pub_timestamp": ts}}


def test_25_signature_known_vectors():
    assert sign("channel", 123, "token") == "3cfb97087e7c99545a9e5d62393ce90e888e48fb"
    assert sign("/messages/new", 1700000000000) == "e6541e9adc999c15f7cbae4fa5dd05e07390551a"


def test_25a_privatepub_subscribe_signed(pp_broker):
    b = pp_broker
    cid = handshake(b)
    ts = now_ms()
    reply = post(b, [pp_subscribe_msg(cid, "/messages/new", ts, sign("/messages/new", ts), "2")])
    assert reply == [{"id": "2", "clientId": cid, "channel": "/meta/subscribe", "successful": True,
                      "subscription": "/messages/new"}]


def test_25b_privatepub_string_and_future_timestamps(pp_broker):
    b = pp_broker
    cid = handshake(b)
    ts = str(now_ms())
    reply = post(b, [pp_subscribe_msg(cid, "/pp/str", ts, sign("/pp/str", ts), "s")])
    assert reply[0]["successful"] is True, reply
    future = now_ms() + 10 * 24 * 3600 * 1000
    reply = post(b, [pp_subscribe_msg(cid, "/pp/future", future, sign("/pp/future", future), "f")])
    if target() == "faye":
        # PrivatePub bounds only the past.
        assert reply == [{"id": "f", "clientId": cid, "channel": "/meta/subscribe", "successful": True,
                          "subscription": "/pp/future"}]
    else:
        # pubsub refuses timestamps more than --max-clock-skew (default 5 minutes) ahead.
        assert reply == [{"id": "f", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                          "error": "Signature timestamp is in the future.", "subscription": "/pp/future"}]


def test_25c_privatepub_wrong_signature(pp_broker):
    b = pp_broker
    cid = handshake(b)
    ts = now_ms()
    for id, sig in [("3", "0" * 40), ("3u", sign("/messages/new", ts).upper()),
                    ("3o", sign("/messages/other", ts)), ("3s", sign("/messages/new", ts, "other"))]:
        reply = post(b, [pp_subscribe_msg(cid, "/messages/new", ts, sig, id)])
        assert reply == [{"id": id, "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                          "error": "Incorrect signature.", "subscription": "/messages/new"}]
    connect_now(b, cid)
    post(b, [{"channel": "/messages/new", "data": 1, "id": "n", "ext": {"private_pub_token": SECRET}}])
    assert poll(b, cid) == []


def test_25d_privatepub_expired_signature(pp_broker):
    b = pp_broker
    cid = handshake(b)
    ts = now_ms() - 2 * 3600 * 1000
    reply = post(b, [pp_subscribe_msg(cid, "/messages/new", ts, sign("/messages/new", ts), "4")])
    assert reply == [{"id": "4", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                      "error": "Signature has expired.", "subscription": "/messages/new"}]


def test_25e_privatepub_wrong_token(pp_broker):
    b = pp_broker
    cid = handshake(b)
    reply = post(b, [{"channel": "/messages/new", "data": 1, "clientId": cid, "id": "5",
                      "ext": {"private_pub_token": "wrong"}},
                     {"channel": "/service/foo", "data": 1, "ext": {"private_pub_token": None}},
                     {"channel": "/messages/new", "data": 1, "id": "5b", "ext": {}}])
    assert reply == [{"id": "5", "clientId": cid, "channel": "/messages/new", "successful": False,
                      "error": "Incorrect token."},
                     {"channel": "/service/foo", "successful": False, "error": "Incorrect token."},
                     {"id": "5b", "channel": "/messages/new", "successful": False, "error": "Incorrect token."}]


def test_25f_privatepub_publish_to_form_post(pp_broker):
    b = pp_broker
    cid = handshake(b)
    ts = now_ms()
    reply = post(b, [pp_subscribe_msg(cid, "/messages/new", ts, sign("/messages/new", ts), "2")])
    assert reply[0]["successful"] is True, reply
    connect_now(b, cid)
    message = {"channel": "/messages/new", "data": {"channel": "/messages/new", "eval": 'alert("hi")'},
               "ext": {"private_pub_token": SECRET}}
    body = "message=" + urllib.parse.quote(json.dumps(message))
    r = post_raw(b, body, content_type="application/x-www-form-urlencoded")
    assert r.status_code == 200
    assert r.json() == [{"channel": "/messages/new", "successful": True}]
    assert poll(b, cid) == [{"channel": "/messages/new",
                             "data": {"channel": "/messages/new", "eval": 'alert("hi")'},
                             "ext": {"private_pub_token": None}}]


def test_25g_privatepub_leaves_other_meta_alone(pp_broker):
    b = pp_broker
    cid = handshake(b)
    reply = post(b, [{"channel": "/meta/unsubscribe", "clientId": cid, "subscription": "/messages/new", "id": "u"}])
    assert reply == [{"id": "u", "clientId": cid, "channel": "/meta/unsubscribe", "successful": True,
                      "subscription": "/messages/new"}]
    connect_now(b, cid)
    reply = post(b, [{"channel": "/meta/disconnect", "clientId": cid, "id": "d"}])
    assert reply == [{"id": "d", "clientId": cid, "channel": "/meta/disconnect", "successful": True}]


@pytest.mark.pubsub_only
def test_25h_privatepub_missing_ext_answered(pp_broker):
    b = pp_broker
    cid = handshake(b)
    reply = post(b, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/messages/new", "id": "x"}],
                 timeout=5)
    assert reply == [{"id": "x", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                      "error": "Incorrect signature.", "subscription": "/messages/new"}]
    reply = post(b, [{"channel": "/messages/new", "data": 1, "id": "y"}], timeout=5)
    assert reply == [{"id": "y", "channel": "/messages/new", "successful": False, "error": "Incorrect token."}]


# ------------------------------------------------------------------ WebSocket

def test_ws_empty_frame(broker):
    with WS(broker) as w:
        w.send([])
        assert w.recv() == []


def test_ws_handshake_and_single_object(broker):
    with WS(broker) as w:
        w.send(handshake_msg("w1", ("websocket",)))
        assert w.recv() == [{"id": "w1", "channel": "/meta/handshake", "successful": True, "version": "1.0",
                             "supportedConnectionTypes": ALL6, "clientId": ANY_CLIENT_ID,
                             "advice": advice_ok(45)}]


def test_ws_events_pushed_one_per_frame_while_connect_held(short_broker):
    b = short_broker
    with WS(b) as w:
        cid = w.handshake()
        w.send([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/chat/*", "id": "s"}])
        assert w.recv() == [{"id": "s", "clientId": cid, "channel": "/meta/subscribe", "successful": True,
                             "subscription": "/chat/*"}]
        w.send([connect_msg(cid, "c0", "websocket", advice_timeout=0)])
        assert w.recv() == [ok_connect(b, cid, "c0")]
        t0 = time.monotonic()
        w.send([connect_msg(cid, "c1", "websocket")])
        time.sleep(0.3)
        publish(b, "/chat/a", {"n": 1}, id="p1")
        publish(b, "/chat/b", {"n": 2}, id="p2")
        assert w.recv() == [{"channel": "/chat/a", "data": {"n": 1}, "id": "p1"}]
        assert w.recv() == [{"channel": "/chat/b", "data": {"n": 2}, "id": "p2"}]
        assert time.monotonic() - t0 < 1.5
        reply = w.recv(timeout=SHORT_TIMEOUT + 5)
        elapsed = time.monotonic() - t0
        assert reply == [ok_connect(b, cid, "c1")]
        assert SHORT_TIMEOUT - 0.5 <= elapsed <= SHORT_TIMEOUT + 2.5, elapsed


def test_ws_publisher_receives_own_event_and_ack(broker):
    with WS(broker) as w:
        cid = w.handshake()
        w.send([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/self", "id": "s"}])
        w.recv()
        w.send([connect_msg(cid, "c0", "websocket", advice_timeout=0)])
        assert w.recv() == [ok_connect(broker, cid, "c0")]
        w.send([connect_msg(cid, "c1", "websocket")])
        w.send([{"channel": "/self", "data": "x", "clientId": cid, "id": "p"}])
        frames = [w.recv(), w.recv()]
        assert sorted(frames, key=json.dumps) == sorted([
            [{"channel": "/self", "data": "x", "id": "p"}],
            [{"id": "p", "clientId": cid, "channel": "/self", "successful": True}]], key=json.dumps)


def test_ws_disconnect_closes_socket(broker):
    with WS(broker) as w:
        cid = w.handshake()
        w.send([connect_msg(cid, "c0", "websocket", advice_timeout=0)])
        assert w.recv() == [ok_connect(broker, cid, "c0")]
        w.send([{"channel": "/meta/disconnect", "clientId": cid, "id": "d"}])
        assert w.recv() == [{"id": "d", "clientId": cid, "channel": "/meta/disconnect", "successful": True}]
        assert w.recv_close() == 1000


def test_ws_close_does_not_destroy_client(broker):
    w = WS(broker)
    cid = w.handshake()
    w.send([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/after/close", "id": "s"}])
    w.recv()
    w.send([connect_msg(cid, "c0", "websocket", advice_timeout=0)])
    w.recv()
    w.close()
    time.sleep(0.3)
    publish(broker, "/after/close", 1, id="ac")
    assert poll(broker, cid) == [{"channel": "/after/close", "data": 1, "id": "ac"}]


def test_ws_http_client_interop(broker):
    """A WebSocket subscriber gets what an HTTP publisher sends and vice versa."""
    hcid = handshake(broker)
    subscribe(broker, hcid, "/mix")
    connect_now(broker, hcid)
    with WS(broker) as w:
        cid = w.handshake()
        w.send([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/mix", "id": "s"}])
        w.recv()
        w.send([connect_msg(cid, "c0", "websocket", advice_timeout=0)])
        w.recv()
        w.send([connect_msg(cid, "c1", "websocket")])
        w.send([{"channel": "/mix", "data": "from-ws", "id": "fw"}])
        frames = [w.recv(), w.recv()]
        assert [{"channel": "/mix", "data": "from-ws", "id": "fw"}] in frames
        assert [{"id": "fw", "channel": "/mix", "successful": True}] in frames
        publish(broker, "/mix", "from-http", id="fh")
        assert w.recv() == [{"channel": "/mix", "data": "from-http", "id": "fh"}]
    assert poll(broker, hcid) == [{"channel": "/mix", "data": "from-ws", "id": "fw"},
                                  {"channel": "/mix", "data": "from-http", "id": "fh"}]


# ------------------------------------------------------------------ EventSource (3.6)

def test_eventsource_stream(broker):
    cid = handshake(broker, ("eventsource", "long-polling"))
    subscribe(broker, cid, "/es/**")
    es = EventStream(broker, cid)
    try:
        assert es.status == 200
        assert es.headers["content-type"] == "text/event-stream"
        assert es.headers["cache-control"] == "no-cache, no-store"
        assert es.next_block() == "retry: 5000"
        reply = post(broker, [connect_msg(cid, "ce", ctype="eventsource")])
        assert reply == [{"id": "ce", "clientId": cid, "channel": "/meta/connect", "successful": True,
                          "advice": {"reconnect": "retry", "interval": 45000, "timeout": 0}}]
        publish(broker, "/es/a/b", "hi", id="e1")
        publish(broker, "/es/c", {"k": [1, 2]}, id="e2")
        for expected in ([{"channel": "/es/a/b", "data": "hi", "id": "e1"}],
                         [{"channel": "/es/c", "data": {"k": [1, 2]}, "id": "e2"}]):
            block = es.next_block()
            assert block.startswith("data: "), block
            assert without_positions(json.loads(block[len("data: "):])) == expected
    finally:
        es.close()


# ------------------------------------------------------------------ deliberate differences (pubsub only)

@pytest.mark.pubsub_only
def test_first_connect_after_handshake_is_immediate(broker):
    cid = handshake(broker)
    reply, elapsed = timed_post(broker, [connect_msg(cid, "first")], timeout=10)
    assert reply == [ok_connect(broker, cid, "first")]
    assert elapsed < 3, elapsed


def test_11b_connect_with_queued_events_is_answered_at_once(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/first/q")
    publish(broker, "/first/q", 1, id="q1")
    reply, elapsed = timed_post(broker, [connect_msg(cid, "first")], timeout=10)
    assert reply == [ok_connect(broker, cid, "first"), {"channel": "/first/q", "data": 1, "id": "q1"}]
    assert elapsed < 3


@pytest.mark.pubsub_only
def test_superseded_connect_is_answered(broker, pool):
    cid = handshake(broker)
    subscribe(broker, cid, "/sup")
    connect_now(broker, cid)
    first = start_connect(pool, broker, cid, "A")
    wait_parked(broker)
    assert not first.done()
    second = start_connect(pool, broker, cid, "B")
    got, _ = first.result(timeout=5)
    assert got == [ok_connect(broker, cid, "A")]
    wait_parked(broker, 0.3)
    assert not second.done(), "the superseding connect must be held"
    publish(broker, "/sup", 1, id="s1")
    got, _ = second.result(timeout=5)
    assert got == [ok_connect(broker, cid, "B"), {"channel": "/sup", "data": 1, "id": "s1"}]


@pytest.mark.pubsub_only
def test_http_connect_batched_with_other_messages_is_immediate(broker):
    cid = handshake(broker)
    connect_now(broker, cid)
    reply, elapsed = timed_post(broker, [connect_msg(cid, "cb"),
                                         {"channel": "/meta/subscribe", "clientId": cid,
                                          "subscription": "/batched", "id": "sb"}], timeout=10)
    assert elapsed < 3, elapsed
    assert sorted(reply, key=lambda m: m["id"]) == [
        ok_connect(broker, cid, "cb"),
        {"id": "sb", "clientId": cid, "channel": "/meta/subscribe", "successful": True,
         "subscription": "/batched"}]


@pytest.mark.pubsub_only
def test_ws_connect_and_subscribe_frame(short_broker):
    b = short_broker
    with WS(b) as w:
        cid = w.handshake()
        w.send([connect_msg(cid, "c0", "websocket", advice_timeout=0)])
        assert w.recv() == [ok_connect(b, cid, "c0")]
        t0 = time.monotonic()
        w.send([connect_msg(cid, "c1", "websocket"),
                {"channel": "/meta/subscribe", "clientId": cid, "subscription": "/frame", "id": "s"}])
        first, elapsed = w.timed_recv()
        assert first == [{"id": "s", "clientId": cid, "channel": "/meta/subscribe", "successful": True,
                          "subscription": "/frame"}]
        assert elapsed < 1.0, elapsed
        publish(b, "/frame", 1, id="f1")
        assert w.recv() == [{"channel": "/frame", "data": 1, "id": "f1"}]
        reply = w.recv(timeout=SHORT_TIMEOUT + 5)
        assert reply == [ok_connect(b, cid, "c1")]
        assert SHORT_TIMEOUT - 0.5 <= time.monotonic() - t0 <= SHORT_TIMEOUT + 2.5


@pytest.mark.pubsub_only
def test_identical_events_not_collapsed(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/dup")
    connect_now(broker, cid)
    for _ in range(3):
        publish(broker, "/dup", 1)
    assert poll(broker, cid) == [{"channel": "/dup", "data": 1}] * 3


@pytest.mark.pubsub_only
def test_a_poll_whose_client_went_away_keeps_the_next_event_for_the_next_poll(broker):
    """A long-polling client closes its connection while its /meta/connect is parked (a tab closed, a network
    switch): the broker sees the close at once and detaches the poll, so an event published afterwards waits in
    the session for the client's next poll instead of going into a socket nobody reads."""
    cid = handshake(broker)
    connect_now(broker, cid)
    subscribe(broker, cid, "/gone")
    body = json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "long-polling",
                        "id": "parked"}]).encode()
    host, port = broker.url.split("//", 1)[1].split("/", 1)[0].split(":")
    s = socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT)
    s.sendall(f"POST /faye HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(0.5)  # parked
    s.close()
    time.sleep(0.5)  # the broker reads the close
    publish(broker, "/gone", "after the close")
    reply, elapsed = timed_post(broker, [connect_msg(cid, "next")])
    assert reply[0]["successful"] is True, reply
    assert [m["data"] for m in reply[1:]] == ["after the close"], reply
    assert elapsed < 3, elapsed
