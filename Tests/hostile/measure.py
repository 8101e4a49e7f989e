#!/usr/bin/env python3
"""The figures of issue 13, before and after: each attack of Tests/hostile at full size, without the tests'
fail-fast bounds, against the broker at $PUBSUB_BIN. Prints one Markdown table row per figure.

    PUBSUB_BIN=.build/debug/pubsub python3 Tests/hostile/measure.py [item ...]

Items are 1 to 9 (all by default). A run takes a few minutes and the broker may grow by about a GiB (item 1) on
a broker without write backpressure. Not collected by pytest (no test_ prefix).
"""

import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import requests
import websocket

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# hostilekit's broker launcher is the test support package's (Tests/pubsubtest), found on PYTHONPATH as pytest.ini's
# `pythonpath` gives it to pytest: run again with Tests/ on it.
if TESTS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]])


from hostilekit import (KiB, MiB, HostileBroker, close_all, metric_value, new_client_served, ones_body,  # noqa: E402
                        open_fds, peak_rss, peer_closed, post_request, raw_socket, read_http_head, read_more, rss,
                        send_for)
from pubsubtest.websocket import TEXT, frame, upgrade_request  # noqa: E402
from pubsubtest.bayeux import connect, handshake, publish, subscribe  # noqa: E402

WAIT = float(os.environ.get("HOSTILE_MEASURE_WAIT", "10"))      # seconds the item-3 connections are watched
ATTACK = float(os.environ.get("HOSTILE_MEASURE_ATTACK", "30"))  # seconds each item-1 attack sends
TIMEOUTS = {"header-timeout": 1, "idle-timeout": 2, "send-timeout": 2, "ping-interval": 1}
ROWS = []


def row(item, attack, figure):
    ROWS.append((item, attack, figure))
    print(f"| {item} | {attack} | {figure} |", flush=True)


class Run:
    """A broker and its baseline, for one measurement."""

    def __init__(self, settings=None, timeout=5):
        self.b = HostileBroker(settings, timeout=timeout)

    def __enter__(self):
        self.b.start()
        time.sleep(0.3)
        self.rss0 = rss(self.b.pid)
        self.fds0 = open_fds(self.b.pid)
        return self

    def __exit__(self, *exc):
        self.b.stop()
        return False

    def growth(self):
        return (peak_rss(self.b.pid) - self.rss0) / MiB

    def settle(self, seconds=20):
        """Waits until the peak RSS stops moving for 2 s (at most `seconds`); returns the growth in MiB."""
        last, still = -1.0, time.monotonic()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            g = self.growth()
            if g != last:
                last, still = g, time.monotonic()
            elif time.monotonic() - still > 2:
                break
            time.sleep(0.2)
        return self.growth()


def item1():
    with Run() as r:
        body = ones_body(500_000)
        resp = requests.post(r.b.url, data=body, headers={"Content-Type": "application/json"}, timeout=120)
        reply = resp.json()
        row(1, "one POST of `[1,1,…]`, 500,000 elements (1 MB)",
            f"{len(reply)} error replies, {len(resp.content) / MiB:.1f} MiB of reply")
    for name, upgrade, request in [
            ("pipelined 1 MB `[1,1,…]` POSTs on one socket", False, post_request(0, ones_body(500_000))),
            ("WebSocket frames of 1 MB `[1,1,…]` on one socket", True, frame(TEXT, ones_body(500_000)))]:
        with Run() as r:
            s = raw_socket(r.b, rcvbuf=4096)
            if upgrade:
                s.sendall(upgrade_request(r.b.port))
                read_http_head(s)
            sent, g10 = _attack_for(r, s, request * 40, ATTACK)
            g = r.growth()
            row(1, f"{name}, never read, for {ATTACK:.0f}s (40 MB offered)",
                f"{sent / MiB:.0f} MiB taken by the broker, RSS +{g:.0f} MiB, "
                f"growing {(g - g10) / 10:.1f} MiB/s over the last 10 s")
            s.close()


def _attack_for(r, s, data, seconds):
    """Sends `data` for `seconds`; returns (bytes taken, RSS growth 10 s before the end)."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("sent", send_for(s, data, seconds)))
    thread.start()
    time.sleep(max(0.0, seconds - 10))
    g10 = r.growth()
    thread.join()
    return result["sent"], g10


def _flood(r, channel, events=50_000, batch=500):
    body = json.dumps([{"channel": channel, "data": "x" * (2 * KiB)} for _ in range(batch)])
    with requests.Session() as session:
        for _ in range(events // batch):
            session.post(r.b.url, data=body, headers={"Content-Type": "application/json"}, timeout=60)


def item2():
    settings = {"max-request-bytes": 4 * MiB}
    for transport in ("EventSource", "WebSocket", "long-poll"):
        with Run(settings, timeout=45) as r:
            b = r.b
            drops0 = metric_value(b, "pubsub_slow_consumer_drops_total")
            ws = None
            if transport == "WebSocket":
                ws = websocket.create_connection(b.ws_url, timeout=10, sockopt=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
                ws.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                     "supportedConnectionTypes": ["websocket"]}]))
                cid = json.loads(ws.recv())[0]["clientId"]
                ws.send(json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket"}]))
                ws.recv()
                ws.send(json.dumps([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/m"}]))
                ws.recv()
                s = ws.sock
            else:
                cid = handshake(b)
                connect(b, cid, advice_timeout=0)
                subscribe(b, cid, "/m")
                s = raw_socket(b, rcvbuf=4096)
                if transport == "EventSource":
                    s.sendall(f"GET /faye/{cid} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".encode())
                    read_http_head(s)
                else:
                    body = json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "long-polling"}])
                    s.sendall(post_request(b.port, body.encode()))
                    time.sleep(0.5)
            _flood(r, "/m")
            g = r.settle(30)
            drops = metric_value(b, "pubsub_slow_consumer_drops_total") - drops0
            later = connect(b, cid, advice_timeout=0)[0]
            logged = cid in b.log()
            row(2 if transport == "EventSource" else "2, 9", f"{transport} subscriber never reads; 50,000 × 2 KiB published",
                f"RSS +{g:.0f} MiB; drops counted {drops:.0f}; later connect: "
                f"{later.get('error') or 'successful'}; drop logged with clientId: {'yes' if logged else 'no'}")
            s.close()


def _count_open(sockets, seconds):
    deadline = time.monotonic() + seconds
    open_ = list(sockets)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        open_ = [s for s in open_ if not peer_closed(s)]
    return len(open_)


def item3():
    with Run({**TIMEOUTS, "max-connections": 200}) as r:
        socks = [raw_socket(r.b) for _ in range(200)]
        first = new_client_served(r.b)
        left = _count_open(socks, WAIT)
        row(3, f"200 silent connections, --max-connections 200 (timeouts {TIMEOUTS})",
            f"new client at once: {first}; {left} of 200 open after {WAIT:.0f}s; new client then: {new_client_served(r.b)}")
        close_all(socks)
    with Run(TIMEOUTS) as r:
        socks = []
        for i in range(500):
            s = raw_socket(r.b)
            s.sendall(f"GET /healthz HTTP/1.1\r\nX-Slow-{i}: ".encode())
            socks.append(s)
        deadline = time.monotonic() + WAIT
        open_ = list(socks)
        while time.monotonic() < deadline:
            for s in list(open_):
                try:
                    s.send(b"a")
                except OSError:
                    open_.remove(s)
            time.sleep(0.25)
            open_ = [s for s in open_ if not peer_closed(s)]
        row(3, "500 slowloris connections, a header byte per 0.25 s each", f"{len(open_)} of 500 open after {WAIT:.0f}s")
        close_all(socks)
    with Run(TIMEOUTS) as r:
        heads = []
        for _ in range(20):
            s = raw_socket(r.b)
            s.sendall(upgrade_request(r.b.port)[:-2])
            heads.append(s)
        silent = []
        for _ in range(20):
            s = raw_socket(r.b)
            s.sendall(upgrade_request(r.b.port))
            read_http_head(s)
            silent.append(s)
        left_h = _count_open(heads, WAIT)
        left_s = _count_open(silent, 0.1)
        row(3, "20 unfinished upgrade requests; 20 upgraded WebSockets that never send (nor pong)",
            f"{left_h} of 20 and {left_s} of 20 open after {WAIT:.0f}s")
        close_all(heads + silent)
    with Run(TIMEOUTS) as r:
        request = f"GET /faye/client.js HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        socks = []
        for _ in range(10):
            s = raw_socket(r.b, rcvbuf=4096)
            send_for(s, request * 50, 1)
            socks.append(s)
        time.sleep(WAIT)
        row(3, "10 clients pipelining GET /faye/client.js, never reading",
            f"broker descriptors {open_fds(r.b.pid)} after {WAIT:.0f}s (baseline {r.fds0})")
        close_all(socks)


def _head(b, path):
    s = raw_socket(b)
    s.sendall(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, headers, rest = read_http_head(s)
    rest += read_more(s, 0.5)
    s.close()
    return status, headers, rest


def item4():
    with Run() as r:
        b = r.b
        status, headers, rest = _head(b, "/healthz")
        row(4, "HEAD /healthz", f"{status}, Content-Length {headers.get('content-length')}, body {rest!r}")
        status, headers, rest = _head(b, "/faye/client.js")
        get = requests.get(f"http://127.0.0.1:{b.port}/faye/client.js", timeout=10)
        row(4, "HEAD /faye/client.js", f"{status}, Content-Length {headers.get('content-length')} "
            f"(GET: {get.headers.get('Content-Length')}), body {len(rest)} bytes")
        published0 = metric_value(b, "pubsub_messages_published_total")
        message = urllib.parse.quote(json.dumps([{"channel": "/head/x", "data": 1}]))
        status, headers, rest = _head(b, f"/faye?message={message}")
        published = metric_value(b, "pubsub_messages_published_total") - published0
        row(4, "HEAD /faye?message=[publish]", f"{status}, body {rest[:60]!r}, messages published: {published:.0f}")


def item5():
    with Run({"max-request-bytes": 1 * MiB}) as r:
        body = b"[" + b"1," * (5 * MiB // 2) + b"1]"
        outcomes = []
        for _ in range(5):
            req = urllib.request.Request(r.b.url, data=body, method="POST", headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    outcomes.append(str(resp.status))
            except urllib.error.HTTPError as e:
                outcomes.append(str(e.code))
            except (urllib.error.URLError, OSError) as e:
                outcomes.append(type(getattr(e, "reason", e)).__name__)
        row(5, "5 MiB POST with urllib (no Expect), limit 1 MiB, 5 times", ", ".join(outcomes))


def item6():
    with Run() as r:
        for name, payload in [("JSON handshake", json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                                               "supportedConnectionTypes": ["websocket"]}]).encode()),
                              ("garbage", b"\xff\xfe garbage")]:
            ws = websocket.create_connection(r.b.ws_url, timeout=5)
            ws.send_binary(payload)
            try:
                opcode, data = ws.recv_data(control_frame=True)
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    outcome = f"closed with {int.from_bytes(data[:2], 'big')}"
                else:
                    outcome = f"reply {data[:80]!r}"
            except Exception as e:  # noqa: BLE001
                outcome = repr(e)
            ws.close()
            row(6, f"binary frame: {name}", outcome)


def item7():
    with Run({"history-ttl": 0, "max-request-bytes": 2 * MiB, "history-bytes": 16 * MiB}) as r:
        with requests.Session() as session:
            for i in range(600):
                body = json.dumps([{"channel": "/nobody", "data": f"{i:08d}" + "x" * (MiB - 8)}])
                session.post(r.b.url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
        g = r.growth()
        time.sleep(5)
        row(7, "600 × 1 MB publishes to a channel nobody reads (--history-ttl 0, --history-bytes 16 MiB if known)",
            f"RSS +{g:.0f} MiB peak, +{(rss(r.b.pid) - r.rss0) / MiB:.0f} MiB 5 s later")


def item8():
    with Run() as r:
        tokens = [handshake(r.b, reply=True)["ext"]["position"]]
        for n in (1, 5):
            for i in range(n):
                publish(r.b, "/secret", i)
            tokens.append(handshake(r.b, reply=True)["ext"]["position"])
        row(8, "handshake positions around 1 then 5 publishes elsewhere", " → ".join(f"`{t}`" for t in tokens))


def item9():
    with Run() as r:
        for path in ["/xyzzy%3Cscript%3E", "/faye/xyzzy%3Cb%3E.js"]:
            resp = requests.get(f"http://127.0.0.1:{r.b.port}{path}", timeout=10)
            row(9, f"GET {path}", f"{resp.status_code}, nosniff: {resp.headers.get('X-Content-Type-Options')}, "
                f"body {resp.text!r}")


ITEMS = {"1": item1, "2": item2, "3": item3, "4": item4, "5": item5, "6": item6, "7": item7, "8": item8, "9": item9}

if __name__ == "__main__":
    chosen = sys.argv[1:] or list(ITEMS)
    print(f"broker: {os.environ.get('PUBSUB_BIN')}")
    print("| item | attack | figure |\n|---|---|---|", flush=True)
    for key in chosen:
        ITEMS[key]()
