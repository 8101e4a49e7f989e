"""Issue 13, item 1: no amplification, and write backpressure.

A request or WebSocket frame with more than --max-messages-per-request messages is refused whole with one Bayeux
error. A client that pipelines requests (or sends frames) and never reads its replies makes the broker stop
reading from it once its unsent replies pass --max-outbound-bytes: the broker's memory stays bounded.
"""

import json

import pytest
import requests
import websocket

from hostilekit import (ERROR_RE, MiB, hostile_broker, ones_body, post_request, raw_socket, read_http_head,
                        send_for)
from pubsubtest.websocket import TEXT, frame as ws_frame, upgrade_request

OUTBOUND = 1 * MiB


def _assert_one_error(reply, what):
    assert isinstance(reply, list), f"{what}: reply is not a JSON array: {str(reply)[:200]}"
    n = len(reply)
    assert n == 1, f"{what}: {n} replies instead of one error, e.g. {reply[:2]}"
    assert reply[0].get("successful") is False, reply
    assert ERROR_RE.match(str(reply[0].get("error"))), reply


@pytest.mark.parametrize("count,limit", [(20_000, 100), (500_000, None)], ids=["20k-over-100", "1MB-over-default"])
def test_oversized_batch_is_refused_whole_with_one_error_over_http(count, limit):
    settings = {"max-messages-per-request": limit} if limit else {}
    with hostile_broker(settings) as (b, g):
        body = ones_body(count)
        r = requests.post(b.url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
        what = f"POST of {count} messages ({len(body)} bytes; HTTP {r.status_code}, reply {len(r.content)} bytes)"
        _assert_one_error(r.json(), what)
        assert len(r.content) < 4096, what
        g.assert_rss(f"after {what}")
        g.assert_served()


def test_oversized_batch_is_refused_whole_with_one_error_over_websocket():
    with hostile_broker({"max-messages-per-request": 100}) as (b, g):
        ws = websocket.create_connection(b.ws_url, timeout=10)
        try:
            ws.send(ones_body(20_000).decode())
            data = ws.recv()
            _assert_one_error(json.loads(data), f"frame of 20000 messages (reply frame {len(data)} bytes)")
            # The socket goes on: the next reply is the handshake's, nothing of the refused frame is left.
            ws.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                 "supportedConnectionTypes": ["websocket"]}]))
            reply = json.loads(ws.recv())
            assert reply[0].get("channel") == "/meta/handshake" and reply[0]["successful"] is True, reply
        finally:
            ws.close()
        g.assert_rss()
        g.assert_served()


# The pipelining attack: one socket that never reads (a tiny receive window), requests sent for a few seconds.
ATTACKS = {
    # the request: 1 MB `[1,1,…,1]`, 500,000 messages over the limit, each refused with a 24 MB reply
    "oversized-batches": lambda port: post_request(port, ones_body(500_000)),
    # within every limit: 1000 messages (2 KB), each answered with an error (about 50 KB of replies)
    "in-limit-batches": lambda port: post_request(port, ones_body(1000)),
    # the browser client, a large static reply to a 50-byte request
    "static-file": lambda port: f"GET /faye/client.js HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode(),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_pipelined_requests_never_read_keep_memory_bounded(attack):
    with hostile_broker({"max-outbound-bytes": OUTBOUND}) as (b, g):
        request = ATTACKS[attack](b.port)
        s = raw_socket(b, rcvbuf=4096)
        try:
            sent = send_for(s, lambda: request * max(1, (256 * 1024) // len(request)), 4, stop=g.over_bound)
            g.assert_rss(f"after {sent / MiB:.1f} MiB of pipelined requests ({attack}) never read")
            g.assert_served(f"while a client pipelines {attack} and never reads")
        finally:
            s.close()
        g.assert_fds_back(what="the pipelining client went")
        g.assert_rss()


@pytest.mark.parametrize("attack", ["oversized-batches", "in-limit-batches"])
def test_websocket_frames_never_read_keep_memory_bounded(attack):
    with hostile_broker({"max-outbound-bytes": OUTBOUND}) as (b, g):
        frame = ws_frame(TEXT, ones_body(500_000 if attack == "oversized-batches" else 1000))
        s = raw_socket(b, rcvbuf=4096)
        try:
            s.sendall(upgrade_request(b.port))
            status, _, _ = read_http_head(s)
            assert status == 101, status
            sent = send_for(s, lambda: frame * max(1, (256 * 1024) // len(frame)), 4, stop=g.over_bound)
            g.assert_rss(f"after {sent / MiB:.1f} MiB of WebSocket frames ({attack}) whose replies are never read")
            g.assert_served(f"while a WebSocket client sends {attack} and never reads")
        finally:
            s.close()
        g.assert_fds_back(what="the WebSocket client went")
        g.assert_rss()
