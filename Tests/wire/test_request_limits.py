"""`--max-messages-per-request`: a request or WebSocket frame over the limit is refused whole, with one error
reply, and nothing in it is handled (pubsub only: Faye has no such limit). The reply bytes of one request are
bounded whatever its number of elements."""

import json

import pytest

from wirekit import (SHORT_TIMEOUT, WS, connect_now, handshake, post, post_raw, server_answers_handshake,
                     subscribe, connect_msg)

pytestmark = [pytest.mark.timeout(60), pytest.mark.pubsub_only]


def pub(i):
    return {"channel": "/lim", "data": i, "id": str(i)}


def test_a_request_over_the_limit_is_refused_whole(make_broker):
    b = make_broker(timeout=SHORT_TIMEOUT, extra_args=("--max-messages-per-request", "3"))
    cid = handshake(b)
    connect_now(b, cid)
    subscribe(b, cid, "/lim")
    reply = post(b, [pub(i) for i in range(4)])
    assert reply == [{"successful": False, "error": "413:3:Too many messages in one request"}], reply
    # nothing of it was published: the held connect ends empty
    events = post(b, [connect_msg(cid, "c1", advice_timeout=300)])
    assert [e for e in events if e.get("channel") == "/lim"] == [], events
    # at the limit, every message is handled
    reply = post(b, [pub(i) for i in range(3)])
    assert reply == [{"id": str(i), "channel": "/lim", "successful": True} for i in range(3)], reply
    events = post(b, [connect_msg(cid, "c2", advice_timeout=300)])
    assert [e["data"] for e in events if e.get("channel") == "/lim"] == [0, 1, 2], events
    server_answers_handshake(b)


def test_a_frame_over_the_limit_is_refused_whole(make_broker):
    b = make_broker(timeout=SHORT_TIMEOUT, extra_args=("--max-messages-per-request", "3"))
    with WS(b) as w:
        w.send([pub(i) for i in range(5)])
        assert w.recv(timeout=5) == [{"successful": False, "error": "413:3:Too many messages in one request"}]
        w.send([pub(i) for i in range(2)])
        assert len(w.recv(timeout=5)) == 2
    server_answers_handshake(b)


def test_half_a_million_elements_get_one_small_reply(broker):
    """A 1 MB body of 500,000 `1`s used to be answered element by element (about 24 MB of replies)."""
    body = b"[" + b",".join([b"1"] * 500_000) + b"]"
    assert len(body) < 1024 * 1024
    r = post_raw(broker, body, timeout=30)
    assert r.status_code == 200, r.text[:200]
    assert len(r.content) < 200, len(r.content)
    assert r.json() == [{"successful": False, "error": "413:1000:Too many messages in one request"}]
    with WS(broker) as w:
        w.sock.send(body.decode())
        assert w.recv(timeout=30) == [{"successful": False, "error": "413:1000:Too many messages in one request"}]
    server_answers_handshake(broker)
