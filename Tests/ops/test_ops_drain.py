"""Graceful drain on SIGTERM: stop accepting, answer every held long-poll connect at once with a successful
reply and advice.reconnect "retry", close WebSockets with 1001, exit 0 within --drain-timeout."""

import json
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from opshelp import Broker, bayeux, connect, free_port, handshake, subscribe, wait_held, wait_until
from pubsubtest.websocket import BayeuxWebSocket

pytestmark = pytest.mark.timeout(120)


def test_sigterm_releases_a_held_long_poll_and_closes_websockets_with_1001():
    b = Broker(timeout=30, extra_args=["--drain-timeout", "6"])
    b.start()
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        # A long-poll client whose second connect is held (for up to 30 s).
        cid = handshake(b.url)
        subscribe(b.url, cid, "/news")
        assert connect(b.url, cid)[0]["successful"] is True
        held = pool.submit(lambda: (bayeux(b.url, [{"channel": "/meta/connect", "clientId": cid,
                                                     "connectionType": "long-polling", "id": "held"}],
                                           timeout=20), time.monotonic()))
        # A WebSocket client with a held connect too.
        ws = BayeuxWebSocket(b)
        wcid = ws.handshake()
        ws.subscribe("/news")
        ws.connect()                 # answered at once
        ws.send([{"channel": "/meta/connect", "clientId": wcid, "connectionType": "websocket", "id": "ws-held"}])
        # A socket's frames are handled in order: the answer to a later subscribe means its connect is held.
        ws.subscribe("/after")
        wait_held(b, 1)
        assert not held.done()

        t0 = time.monotonic()
        b._proc.send_signal(signal.SIGTERM)

        reply, answered_at = held.result(timeout=10)
        assert answered_at - t0 < 2.0, answered_at - t0
        assert reply == [{"id": "held", "clientId": cid, "channel": "/meta/connect", "successful": True,
                          "advice": {"reconnect": "retry", "interval": 0, "timeout": 30000}}], reply

        code = ws.recv_close(timeout=5)
        assert code == 1001, (code, ws.pending)
        # The held WebSocket connect was answered before the close, successfully, with retry advice.
        answers = [m for m in ws.pending if m.get("id") == "ws-held"]
        assert answers and answers[0]["successful"] is True and answers[0]["advice"]["reconnect"] == "retry"
        assert time.monotonic() - t0 < 3.0

        rc = b._proc.wait(timeout=8)
        assert rc == 0, b.log()
        assert time.monotonic() - t0 < 6.0
        wait_until(lambda: "draining" in b.log() and "drained" in b.log(), 5, message="the drain's log lines")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        b.stop()


def test_stops_accepting_at_once_and_exits_within_the_drain_timeout_despite_a_stuck_client():
    metrics_port = free_port()
    b = Broker(timeout=30, extra_args=["--drain-timeout", "3", "--metrics-port", str(metrics_port)])
    b.start()
    try:
        # A client that sent half a request and then nothing: only the timeout ends it.
        stuck = socket.create_connection(("127.0.0.1", b.port), timeout=10)
        stuck.sendall(b"POST /faye HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        # An idle keep-alive connection: closed by the drain at once.
        idle = socket.create_connection(("127.0.0.1", b.port), timeout=10)
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(0.2)

        t0 = time.monotonic()
        b._proc.send_signal(signal.SIGTERM)
        idle.settimeout(2)
        assert idle.recv(4096) == b""  # closed by the broker, not by the test
        assert time.monotonic() - t0 < 1.5

        # New connections are refused; the metrics port says it is draining.
        def refused():
            try:
                socket.create_connection(("127.0.0.1", b.port), timeout=0.5).close()
            except ConnectionRefusedError:
                return True
            return False

        assert wait_until(refused, 2, raises=False)
        r = requests.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2)
        assert (r.status_code, r.text) == (503, "draining\n")
        assert requests.get(f"http://127.0.0.1:{metrics_port}/healthz", timeout=2).status_code == 200

        rc = b._proc.wait(timeout=6)
        elapsed = time.monotonic() - t0
        assert rc == 0, b.log()
        assert 1.5 < elapsed < 3.0, elapsed  # it waited for the stuck client, but not beyond the timeout
        # The log is read by a thread of the test: its last lines may come just after the exit.
        wait_until(lambda: "closing connections still open at the end of the drain" in b.log(), 5,
                   message="the drain's last log line")
        stuck.close()
        idle.close()
    finally:
        b.stop()


def test_a_connect_that_completes_during_the_drain_is_answered_at_once():
    b = Broker(timeout=30, extra_args=["--drain-timeout", "4"])
    b.start()
    try:
        cid = handshake(b.url)
        assert connect(b.url, cid)[0]["successful"] is True
        # The head of the next connect arrives before the drain, its body during it.
        body = json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "long-polling"}])
        conn = socket.create_connection(("127.0.0.1", b.port), timeout=10)
        conn.sendall((f"POST /faye HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n").encode())
        time.sleep(0.3)
        b._proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "] draining" in b.log(), 5, message="the drain begun")
        t0 = time.monotonic()
        conn.sendall(body.encode())
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"]"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        assert time.monotonic() - t0 < 2, "the connect was held during the drain"
        head, _, payload = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), data
        assert b"connection: close" in head.lower(), head
        reply = json.loads(payload)
        assert reply[0]["successful"] is True and reply[0]["advice"]["reconnect"] == "retry", reply
        assert b._proc.wait(timeout=8) == 0, b.log()
        conn.close()
    finally:
        b.stop()
