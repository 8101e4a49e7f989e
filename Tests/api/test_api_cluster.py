"""The server API on two nodes sharing a real Redis: every answer is cluster-wide, whichever node is asked."""


import pytest

from apikit import APIBroker, api_handshake, api_subscribe, bayeux, new_key, parked_connect
from pubsubtest.bayeux import connect
from pubsubtest.redis import RedisServer, wait_ready
from pubsubtest.wait import wait_until


@pytest.fixture(scope="module")
def two_nodes():
    redis = RedisServer()
    redis.start()
    key = new_key()
    args = ("--engine", "redis", "--redis-url", redis.url, "--redis-prefix", "api-test:")
    nodes = [APIBroker(key=key, extra_args=args, timeout=5) for _ in range(2)]
    try:
        for n in nodes:
            n.start()
            wait_ready(n)
        yield nodes
    finally:
        for n in nodes:
            n.stop()
        redis.stop()


def test_channels_presence_and_info_cover_both_nodes(two_nodes):
    one, two = two_nodes
    a, b = api_handshake(one), api_handshake(two)
    api_subscribe(one, a, "/cl/room")
    api_subscribe(two, b, "/cl/room", "/cl/other")
    for node in (one, two):
        got = {e["channel"]: e["subscribers"]
               for e in node.ok("GET", "channels", params={"pattern": "/cl/**"})["channels"]}
        assert got == {"/cl/room": 2, "/cl/other": 1}
        clients = wait_until(lambda: (lambda c: c if all(x["transport"] for x in c) else None)(
            node.ok("GET", "presence", params={"channel": "/cl/room"})["clients"]))
        assert {c["clientId"] for c in clients} == {a, b}
        assert {c["transport"] for c in clients} == {"long-polling"}
        assert all(c["user"] is None and c["since"].endswith("Z") for c in clients)
    info = wait_until(lambda: (lambda i: i if len(i["nodes"]) == 2 else None)(one.ok("GET", "info")), timeout=5)
    assert info["clients"] >= 2
    assert sum(n["clients"].get("long-polling", 0) for n in info["nodes"]) >= 2
    assert len({n["id"] for n in info["nodes"]}) == 2


def test_publish_and_kick_across_nodes(two_nodes):
    one, two = two_nodes
    cid = api_handshake(two)
    api_subscribe(two, cid, "/cl/kick")
    t, box = parked_connect(two, cid)
    position = one.ok("POST", "publish", json_body={"channel": "/cl/kick", "data": "x"})["position"]
    t.join(10)
    event = [m for m in box[0] if m.get("channel") == "/cl/kick"][0]
    assert event["ext"]["position"] == position
    t, box = parked_connect(two, cid)
    assert one.ok("POST", "disconnect", json_body={"clientId": cid}) == {"disconnected": True}
    t.join(10)
    assert box, "the parked connect on the other node was not answered"
    reply = [m for m in box[0] if m.get("channel") == "/meta/connect"][0]
    assert reply["advice"] == {"reconnect": "none"} and reply["successful"] is False
    assert two.ok("GET", "presence", params={"channel": "/cl/kick"})["clients"] == []
    assert one.ok("POST", "disconnect", json_body={"clientId": cid}) == {"disconnected": False}
    for node in (one, two):  # not parked any more: its next connect, on either node, says the same
        again = [m for m in connect(node, cid) if m.get("channel") == "/meta/connect"][0]
        assert again["advice"] == {"reconnect": "none"}


def test_history_is_shared(two_nodes):
    one, two = two_nodes
    positions = [one.ok("POST", "publish", json_body={"channel": "/cl/h", "data": i})["position"] for i in range(3)]
    answer = two.ok("GET", "history", params={"channel": "/cl/h", "since": positions[0]})
    assert answer["recovered"] is True
    assert [m["data"] for m in answer["messages"]] == [1, 2]
    assert [m["position"] for m in answer["messages"]] == positions[1:]
    assert two.ok("GET", "history", params={"channel": "/cl/h", "since": "1.zz.1"})["recovered"] is False
