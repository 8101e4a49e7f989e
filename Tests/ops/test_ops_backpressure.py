"""Write backpressure: a client that never reads is bounded on the way out, whatever its transport. The broker stops
reading a connection whose outbound bytes pass --max-outbound-bytes; its events wait, up to --max-queue, then the
client is dropped: counted in pubsub_slow_consumer_drops_total, logged with its id and transport, and its next
connect answered 409 with advice to handshake again. A well-behaved client keeps being served meanwhile."""

import os
import socket
import struct

import pytest

from pubsubtest.websocket import TEXT, frame, upgrade_request
from opshelp import Broker, bayeux, connect, handshake, metric, scrape, subscribe, wait_until

pytestmark = pytest.mark.timeout(120)

PAYLOAD = "x" * 2048
RSS_BOUND_MIB = 64


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


def never_reading_socket(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    return s


def flood(b, channel, batches=160, per_batch=25):
    """Publishes batches × per_batch events of 2 KiB (8 MiB in all by default); a batch stays under --max-queue,
    so what overflows is the connection's backlog, not one burst in the engine."""
    for _ in range(batches):
        reply = bayeux(b.url, [{"channel": channel, "data": PAYLOAD}] * per_batch)
        assert all(r["successful"] for r in reply)


def assert_dropped(b, cid, transport):
    samples = scrape(f"http://127.0.0.1:{b.port}/metrics")
    assert metric(samples, "pubsub_slow_consumer_drops_total") == 1.0
    reply = connect(b.url, cid)
    assert reply[0]["successful"] is False
    assert reply[0]["error"] == f"409:{cid}:Queue overflow"
    assert reply[0]["advice"] == {"reconnect": "handshake"}
    wait_until(lambda: f"pubsub.client.id={cid} pubsub.transport={transport}" in b.log(), 5,
               message="the drop is logged")
    assert "slow consumer dropped" in b.log()


def assert_others_served(b):
    """A well-behaved subscriber still gets what is published."""
    cid = handshake(b.url)
    subscribe(b.url, cid, "/fine")
    connect(b.url, cid)
    bayeux(b.url, [{"channel": "/fine", "data": "hello"}])
    reply = connect(b.url, cid)
    assert {"channel": "/fine", "data": "hello"} in [
        {k: v for k, v in m.items() if k in ("channel", "data")} for m in reply]


ARGS = ["--max-queue", "100", "--max-outbound-bytes", "65536", "--history-size", "0"]


def test_eventsource_that_never_reads_is_dropped():
    with Broker(timeout=5, extra_args=ARGS) as b:
        cid = handshake(b.url)
        subscribe(b.url, cid, "/es")
        s = never_reading_socket(b.port)
        s.sendall(f"GET /faye/{cid} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".encode())
        wait_until(lambda: metric(scrape(f"http://127.0.0.1:{b.port}/metrics"), "pubsub_clients",
                                  transport="eventsource") == 1.0, 5, message="stream attached")
        before = rss_mib(b.pid)
        flood(b, "/es")
        grown = rss_mib(b.pid) - before
        assert grown < RSS_BOUND_MIB, f"RSS grew {grown} MiB"
        assert_dropped(b, cid, "eventsource")
        assert_others_served(b)
        s.close()


def test_websocket_that_never_reads_is_dropped():
    with Broker(timeout=5, extra_args=ARGS) as b:
        s = never_reading_socket(b.port)
        s.sendall(upgrade_request(b.port, host="x"))
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        assert head.startswith(b"HTTP/1.1 101")
        cid = handshake(b.url)
        subscribe(b.url, cid, "/ws")
        s.sendall(frame(TEXT, '[{"channel":"/meta/connect","clientId":"%s","connectionType":"websocket"}]' % cid,
                        mask=os.urandom(4)))
        wait_until(lambda: metric(scrape(f"http://127.0.0.1:{b.port}/metrics"), "pubsub_clients",
                                  transport="websocket") == 1.0, 5, message="socket bound")
        before = rss_mib(b.pid)
        flood(b, "/ws")
        grown = rss_mib(b.pid) - before
        assert grown < RSS_BOUND_MIB, f"RSS grew {grown} MiB"
        assert_dropped(b, cid, "websocket")
        assert_others_served(b)
        s.close()
