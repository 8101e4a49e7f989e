"""Issue 13, items 2 and 9 (first half): every transport goes through the same slow-consumer policy.

A subscriber that never reads (EventSource, WebSocket, long-poll) is sent events until its queue passes
--max-queue; then it is dropped: its connection is ended, its next /meta/connect is told
`409:<clientId>:Queue overflow` with advice `handshake`, the drop is counted in /metrics
(pubsub_slow_consumer_drops_total) and logged with its clientId. The broker's memory stays bounded meanwhile.
"""

import json
import socket
import urllib.parse

import pytest
import requests
import websocket

from hostilekit import (KiB, MiB, assert_overflow_error, hostile_broker, metric_value, raw_socket, read_http_head,
                        read_to_eof)
from pubsubtest.bayeux import connect, handshake, subscribe
from pubsubtest.metrics import wait_held
from pubsubtest.wait import wait_until

DROPS = "pubsub_slow_consumer_drops_total"
MAX_QUEUE = 500
SETTINGS = {"max-queue": MAX_QUEUE, "max-request-bytes": 4 * MiB, "max-outbound-bytes": 1 * MiB}
EVENT = 2 * KiB
BATCH = MAX_QUEUE // 2  # events per publish request: a subscriber that reads never overflows on one batch
BATCHES = 200           # 50,000 events of 2 KiB at most: 100 MB
HOLD = 30               # --timeout: no session expires while the flood runs


def flood(b, g, channel, drops0):
    """Publishes batches of 2 KiB events on `channel` until the broker counts a drop, its memory passes the
    bound, or BATCHES are sent; returns the number of events published."""
    data = "x" * EVENT
    body = json.dumps([{"channel": channel, "data": data} for _ in range(BATCH)])
    published = 0
    with requests.Session() as session:
        for _ in range(BATCHES):
            r = session.post(b.url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
            assert r.status_code == 200, (r.status_code, r.text[:200])
            published += BATCH
            if g.over_bound() or metric_value(b, DROPS) > drops0:
                break
    return published


def assert_dropped(b, g, cid, drops0, published, transport):
    what = f"{published} events of 2 KiB published to the {transport} subscriber that never reads"
    g.assert_rss(f"after {what}")
    assert wait_until(lambda: metric_value(b, DROPS) > drops0, 5, raises=False), \
        f"no slow-consumer drop counted in /metrics ({DROPS}) after {what} {b.describe()}"
    reply = connect(b, cid)[0]
    assert_overflow_error(reply, cid)
    assert wait_until(lambda: cid in b.log(), 2, raises=False), \
        f"the drop of {transport} client {cid} is not logged with its clientId:\n{b.log()[-2000:]}"


def test_eventsource_that_never_reads_is_dropped_for_overflow():
    with hostile_broker(SETTINGS, timeout=HOLD) as (b, g):
        cid = handshake(b, types=("eventsource", "long-polling"))
        connect(b, cid, advice_timeout=0)
        subscribe(b, cid, "/es")
        s = raw_socket(b, rcvbuf=4096)
        try:
            s.sendall(f"GET /faye/{cid} HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\n"
                      f"Accept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n".encode())
            status, _, _ = read_http_head(s)    # the stream is open; from here on it never reads
            assert status == 200, status
            drops0 = metric_value(b, DROPS)
            published = flood(b, g, "/es", drops0)
            g.assert_served("while an EventSource subscriber never reads")
            assert_dropped(b, g, cid, drops0, published, "EventSource")
            assert read_to_eof(s, 10), "the dropped EventSource stream is not ended by the broker"
        finally:
            s.close()
        g.assert_fds_back(what="the EventSource client went")


def test_websocket_that_never_reads_is_dropped_for_overflow():
    with hostile_broker(SETTINGS, timeout=HOLD) as (b, g):
        ws = websocket.create_connection(b.ws_url, timeout=10,
                                        sockopt=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
        try:
            ws.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                 "supportedConnectionTypes": ["websocket"]}]))
            cid = json.loads(ws.recv())[0]["clientId"]
            ws.send(json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket"}]))
            json.loads(ws.recv())
            ws.send(json.dumps([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/ws"}]))
            assert json.loads(ws.recv())[0]["successful"] is True
            # From here on it never reads.
            drops0 = metric_value(b, DROPS)
            published = flood(b, g, "/ws", drops0)
            g.assert_served("while a WebSocket subscriber never reads")
            assert_dropped(b, g, cid, drops0, published, "WebSocket")
            assert read_to_eof(ws.sock, 10), "the dropped WebSocket is not closed by the broker"
        finally:
            ws.sock.close()
        g.assert_fds_back(what="the WebSocket client went")


@pytest.mark.parametrize("transport", ["long-polling", "callback-polling"])
def test_long_poll_client_that_never_reads_is_dropped_and_logged(transport):
    with hostile_broker(SETTINGS, timeout=HOLD) as (b, g):
        cid = handshake(b)
        connect(b, cid, advice_timeout=0)
        subscribe(b, cid, "/lp")
        s = raw_socket(b, rcvbuf=4096)
        try:
            body = json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": transport}])
            if transport == "long-polling":
                s.sendall((f"POST /faye HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
            else:   # JSON-P
                query = urllib.parse.urlencode({"message": body, "jsonp": "cb"})
                s.sendall(f"GET /faye?{query} HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\n\r\n".encode())
            wait_held(b, 1, transport=transport)     # parked; it never reads the reply
            drops0 = metric_value(b, DROPS)
            published = flood(b, g, "/lp", drops0)
            g.assert_served(f"while a {transport} subscriber never reads")
            assert_dropped(b, g, cid, drops0, published, transport)
        finally:
            s.close()
        g.assert_fds_back(what=f"the {transport} client went")
