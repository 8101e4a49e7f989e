"""Issue 13, item 3: header, idle, send and ping timeouts.

Connections that send nothing, that trickle a request head one byte at a time, that stop half-way through a
WebSocket upgrade, that never read what they asked for, or WebSockets that never answer a ping, are closed by the
broker after the timeouts; and a parked long-poll, an open EventSource and an idle WebSocket that answers pings
are never cut by them.
"""

import socket
import time

import requests

from hostilekit import (close_all, hostile_broker, new_client_served, open_fds, peer_closed, raw_socket,
                        read_http_head, send_for)
from pubsubtest.websocket import upgrade_request
from pubsubtest.bayeux import connect, handshake, publish, subscribe
from pubsubtest.wait import wait_until

HEADER = 1      # --header-timeout
IDLE = 2        # --idle-timeout
SEND = 2        # --send-timeout
PING = 1        # --ping-interval
HOLD = 4        # --timeout: a /meta/connect is held longer than the idle timeout
TIMEOUTS = {"header-timeout": HEADER, "idle-timeout": IDLE, "send-timeout": SEND, "ping-interval": PING}
MARGIN = 3      # seconds granted beyond a timeout before a connection must be gone


def still_open(sockets):
    return [s for s in sockets if not peer_closed(s)]


def wait_all_closed(sockets, seconds):
    """Polls the sockets until the broker closed all of them or `seconds` pass; returns those still open."""
    left = [list(sockets)]

    def all_closed():
        left[0] = still_open(left[0])
        return not left[0]

    wait_until(all_closed, seconds, interval=0.1, raises=False)
    return left[0]


def test_silent_connections_at_max_connections_are_closed_and_a_new_client_is_served():
    with hostile_broker({**TIMEOUTS, "max-connections": 200}, timeout=HOLD) as (b, g):
        sockets = []
        try:
            for _ in range(200):
                sockets.append(raw_socket(b))
            g.assert_served("while 200 silent connections are open")
            waited = HEADER + IDLE + MARGIN
            left = wait_all_closed(sockets, waited)
            assert len(left) == 0, (f"{len(left)} of 200 silent connections still open after {waited}s "
                              f"(new client: {new_client_served(b)}) {b.describe()}")
            served = wait_until(lambda: new_client_served(b) is True, 3, interval=0.2, raises=False)
            assert served, f"a new client is not served once the silent connections are gone: {new_client_served(b)}"
        finally:
            close_all(sockets)
        g.assert_served()
        g.assert_fds_back(what="the silent connections")
        g.assert_rss()


def test_slowloris_header_trickle_is_closed_after_the_header_timeout():
    with hostile_broker(TIMEOUTS, timeout=HOLD) as (b, g):
        sockets = []
        try:
            for i in range(300):
                s = raw_socket(b)
                s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-{i}: ".encode())
                sockets.append(s)
            open_ = list(sockets)
            deadline = time.monotonic() + HEADER + MARGIN
            while open_ and time.monotonic() < deadline:
                for s in list(open_):   # one more byte on each, so bytes keep trickling in
                    try:
                        s.send(b"a")
                    except OSError:
                        open_.remove(s)
                time.sleep(0.2)
                open_ = still_open(open_)
            assert len(open_) == 0, (f"{len(open_)} of 300 slowloris connections still open after {HEADER + MARGIN}s "
                               f"of trickling a header (--header-timeout {HEADER}) {b.describe()}")
            g.assert_served("while 300 connections trickle their headers")
        finally:
            close_all(sockets)
        g.assert_fds_back(what="the slowloris connections")
        g.assert_rss()


def test_half_done_websocket_upgrades_are_closed():
    with hostile_broker(TIMEOUTS, timeout=HOLD) as (b, g):
        heads, silent = [], []
        try:
            for _ in range(20):      # the upgrade request is never finished
                s = raw_socket(b)
                s.sendall(upgrade_request(b.port)[:-2])
                heads.append(s)
            for _ in range(20):      # upgraded, then never a frame and never a pong
                s = raw_socket(b)
                s.sendall(upgrade_request(b.port))
                status, _, _ = read_http_head(s)
                assert status == 101, status
                silent.append(s)
            waited = max(HEADER, 2 * PING) + MARGIN
            wait_all_closed(heads + silent, waited)
            left_heads, left_silent = still_open(heads), still_open(silent)
            assert len(left_heads) + len(left_silent) == 0, (
                f"after {waited}s: {len(left_heads)} of 20 unfinished upgrade requests and {len(left_silent)} of 20 "
                f"silent WebSockets (no pong) still open {b.describe()}")
            g.assert_served("while half-done WebSocket upgrades hang around")
        finally:
            close_all(heads + silent)
        g.assert_fds_back()
        g.assert_rss()


def test_connections_whose_writes_are_blocked_are_closed_after_the_send_timeout():
    with hostile_broker(TIMEOUTS, timeout=HOLD) as (b, g):
        request = f"GET /faye/client.js HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\n\r\n".encode()
        sockets = []
        try:
            for _ in range(10):      # each asks for the browser client 200 times (4 MB) and never reads
                s = raw_socket(b, rcvbuf=4096)
                send_for(s, request * 200, 1)
                sockets.append(s)
            fds_attack = wait_until(lambda: open_fds(b.pid) >= g.fds0 + 10 and open_fds(b.pid), 3, raises=False)
            assert fds_attack, f"the broker did not accept the 10 connections ({open_fds(b.pid)}, baseline {g.fds0})"
            waited = SEND + IDLE + MARGIN
            back = wait_until(lambda: open_fds(b.pid) <= g.fds0 + 2, waited, interval=0.2, raises=False)
            assert back, (f"broker still has {open_fds(b.pid)} descriptors (baseline {g.fds0}, {fds_attack} during "
                          f"the attack) {waited}s after 10 clients stopped reading (--send-timeout {SEND}) "
                          f"{b.describe()}")
            g.assert_served("while 10 clients never read their replies")
        finally:
            close_all(sockets)
        g.assert_rss()


# ---------------------------------------------------------------- and what is never cut

def test_parked_long_poll_is_held_past_the_idle_timeout():
    with hostile_broker(TIMEOUTS, timeout=HOLD) as (b, g):
        with requests.Session() as session:      # one keep-alive connection
            cid = handshake(b, session=session)
            connect(b, cid, advice_timeout=0, session=session)
            t0 = time.monotonic()
            reply = connect(b, cid, session=session, timeout=HOLD + 10)
            elapsed = time.monotonic() - t0
            assert reply[0]["successful"] is True, reply
            assert elapsed >= HOLD - 0.5, f"held {elapsed:.1f}s instead of {HOLD}s (idle timeout {IDLE}s)"
            # and the connection goes on for the next one
            assert subscribe(b, cid, "/lp", session=session)["successful"] is True
        g.assert_served()


def test_open_eventsource_is_not_cut():
    with hostile_broker(TIMEOUTS, timeout=HOLD) as (b, g):
        cid = handshake(b, types=("eventsource", "long-polling"))
        connect(b, cid, advice_timeout=0)
        subscribe(b, cid, "/es")
        s = raw_socket(b)
        try:
            s.sendall(f"GET /faye/{cid} HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\n"
                      f"Accept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n".encode())
            status, _, rest = read_http_head(s)
            assert status == 200, status
            time.sleep(max(HEADER, IDLE, 2 * PING, SEND) + 1)
            publish(b, "/es", "still-here")
            data = rest
            deadline = time.monotonic() + 3
            while b"still-here" not in data and time.monotonic() < deadline:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                data += chunk
            assert b"still-here" in data, f"an idle EventSource was cut or got nothing: {data[-300:]!r}"
        finally:
            s.close()
        g.assert_served()


def test_idle_websocket_that_answers_pings_is_not_cut():
    # The hold is longer than the test: the probe sends nothing but pongs while it waits.
    with hostile_broker(TIMEOUTS, timeout=30) as (b, g):
        time.sleep(max(IDLE, 2 * PING, SEND) + 2)
        g.assert_served("after being idle longer than every timeout")
        g.assert_fds_back()


def test_websocket_across_a_held_connect_is_not_cut():
    # A Faye client's WebSocket: a /meta/connect held longer than the idle timeout, then the next one.
    with hostile_broker(TIMEOUTS, timeout=HOLD) as (b, g):
        time.sleep(HOLD + 1)
        g.assert_served("across a held connect longer than the idle timeout")


def test_a_websocket_reader_that_stalls_is_closed_after_the_send_timeout_and_loses_nothing():
    """A subscriber stops reading (a phone in a tunnel): the kernel may hold only a bounded part of what the broker
    writes, so the connection becomes unwritable and is closed after --send-timeout, instead of swallowing hundreds
    of KB into an autotuned buffer. The same session then comes back on a new WebSocket (as Faye's clients do): every
    event it had not confirmed goes out again, so the two sockets together saw every event published."""
    import json

    from websocket import create_connection

    events = 400
    # Pings far apart: the send timeout, not the silence of a reader that answers no ping, closes the socket.
    with hostile_broker({**TIMEOUTS, "ping-interval": 60}, timeout=HOLD) as (b, g):
        url = f"ws://127.0.0.1:{b.port}/faye"

        def ws(rcvbuf=None):
            opts = [(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)] if rcvbuf else []
            return create_connection(url, timeout=10, sockopt=opts)

        def messages(frame):
            return json.loads(frame) if frame else []

        seen = set()

        def note(batch):
            for m in batch:
                if isinstance(m.get("data"), dict) and "n" in m["data"]:
                    seen.add(m["data"]["n"])

        stalled = ws(rcvbuf=4096)
        stalled.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                  "supportedConnectionTypes": ["websocket"], "id": "h"}]))
        cid = messages(stalled.recv())[0]["clientId"]
        stalled.send(json.dumps([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/stall", "id": "s"},
                                 {"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket",
                                  "id": "c1"}]))
        got = wait_until(lambda: any(m.get("channel") == "/meta/connect" for m in messages(stalled.recv())), 10,
                         raises=False)
        assert got, "the first connect was not answered"
        stalled.send(json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket",
                                  "id": "c2"}]))
        fds_before = open_fds(b.pid)
        pad = "x" * 1000
        for n in range(events):     # the subscriber reads none of it
            publish(b, "/stall", {"n": n, "pad": pad})
        waited = SEND + MARGIN + 5
        closed = wait_until(lambda: open_fds(b.pid) < fds_before, waited, interval=0.2, raises=False)
        assert closed, (f"the stalled WebSocket is still open {waited}s after 400 KB were published to it "
                        f"(--send-timeout {SEND}) {b.describe()}")
        # What its kernel buffers held reaches it once it reads again, up to the broker's close.
        try:
            while True:
                note(messages(stalled.recv()))
        except Exception:
            pass
        stalled.close()
        assert len(seen) < events, "the stalled reader got everything: the test did not stall it"
        # The same session on a new WebSocket, repeating its connect as Faye's client does: what was not
        # confirmed comes again.
        again = ws()
        again.send(json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket",
                                "id": "c2"}]))

        def everything():
            note(messages(again.recv()))
            return len(seen) == events

        done = wait_until(everything, 20, raises=False)
        assert done, f"{events - len(seen)} of {events} events never arrived on either socket: {sorted(set(range(events)) - seen)[:20]}"
        again.close()
        g.assert_served()
