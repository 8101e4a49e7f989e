"""Issue 13, items 4, 5 and 9 (second half): HEAD, a readable 413, and a 404 that echoes nothing.

- HEAD answers headers only, with the Content-Length a GET would have, so a keep-alive connection stays in step;
  HEAD on the mount never runs the Bayeux messages of its query.
- A body over --max-request-bytes sent without `Expect: 100-continue` (Python's urllib) gets a 413 it can read,
  not a reset (lingering close); and the drain after it is bounded.
- The 404 response says `X-Content-Type-Options: nosniff` and does not echo the request path.
"""

import json
import time
import urllib.error
import urllib.parse
import urllib.request

import websocket

from hostilekit import MiB, hostile_broker, raw_socket, read_http_head, read_more, send_for


def _request(method, path, port, extra=""):
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode()


def _exchange(s, method, path, port):
    """One request on a keep-alive socket; returns (status, headers, the bytes read past the head)."""
    s.sendall(_request(method, path, port))
    status, headers, rest = read_http_head(s)
    return status, headers, rest


def test_head_then_get_on_one_connection_stays_in_step():
    with hostile_broker() as (b, g):
        s = raw_socket(b)
        try:
            status, head_headers, rest = _exchange(s, "HEAD", "/healthz", b.port)
            assert status == 200, status
            rest += read_more(s, 0.5)
            assert rest == b"", f"HEAD /healthz sent a body: {rest[:100]!r}"
            status, get_headers, body = _exchange(s, "GET", "/healthz", b.port)
            assert status == 200, status
            length = int(get_headers["content-length"])
            assert length > 0, get_headers
            assert head_headers.get("content-length") == str(length), \
                f"HEAD says Content-Length {head_headers.get('content-length')}, GET {length}"
            body += read_more(s, 0.3) if len(body) < length else b""
            assert body[:length] == b"ok\n", body
        finally:
            s.close()
        g.assert_served()


def test_head_of_the_browser_client_has_the_length_of_get():
    with hostile_broker() as (b, g):
        s = raw_socket(b)
        try:
            status, head_headers, rest = _exchange(s, "HEAD", "/faye/client.js", b.port)
            assert status == 200, status
            rest += read_more(s, 0.5)
            assert rest == b"", f"HEAD /faye/client.js sent a body: {rest[:100]!r}"
        finally:
            s.close()
        s = raw_socket(b)
        try:
            status, get_headers, _ = _exchange(s, "GET", "/faye/client.js", b.port)
            assert status == 200, status
        finally:
            s.close()
        assert int(get_headers["content-length"]) > 0, get_headers
        assert head_headers.get("content-length") == get_headers["content-length"], \
            f"HEAD says Content-Length {head_headers.get('content-length')}, GET {get_headers['content-length']}"
        g.assert_served()


def test_head_on_the_mount_runs_no_bayeux_message():
    with hostile_broker() as (b, g):
        sub = websocket.create_connection(b.ws_url, timeout=5)
        try:
            sub.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                  "supportedConnectionTypes": ["websocket"]}]))
            cid = json.loads(sub.recv())[0]["clientId"]
            sub.send(json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket"},
                                 {"channel": "/meta/subscribe", "clientId": cid, "subscription": "/head/x"}]))
            got = []
            while not any(m.get("channel") == "/meta/subscribe" for m in got):
                got += json.loads(sub.recv())
            message = urllib.parse.quote(json.dumps([{"channel": "/head/x", "data": "from-head"}]))
            s = raw_socket(b)
            try:
                status, headers, rest = _exchange(s, "HEAD", f"/faye?message={message}", b.port)
                rest += read_more(s, 0.5)
            finally:
                s.close()
            sub.settimeout(1.5)
            events = []
            try:
                while True:
                    events += [m for m in json.loads(sub.recv()) if m.get("channel") == "/head/x"]
            except websocket.WebSocketTimeoutException:
                pass
            assert events == [], f"HEAD /faye?message=… (HTTP {status}) published: {events}"
            assert rest == b"", f"HEAD /faye?message=… (HTTP {status}) sent a body: {rest[:200]!r}"
        finally:
            sub.close()
        g.assert_served()


def test_413_is_readable_by_a_client_that_sends_the_whole_body():
    with hostile_broker({"max-request-bytes": 1 * MiB}) as (b, g):
        body = b"[" + b"1," * (5 * MiB // 2) + b"1]"   # 5 MiB, sent whole by urllib, no Expect: 100-continue
        outcomes = []
        for _ in range(3):
            request = urllib.request.Request(b.url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as r:
                    outcomes.append(f"HTTP {r.status}")
            except urllib.error.HTTPError as e:
                text = e.read()
                outcomes.append(f"HTTP {e.code}" if text else f"HTTP {e.code} (empty body)")
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                outcomes.append(f"{type(e).__name__}: {getattr(e, 'reason', e)}")
        assert outcomes == ["HTTP 413"] * 3, f"a 5 MiB POST with a 1 MiB limit, three times: {outcomes}"
        g.assert_served()
        g.assert_fds_back()


def test_the_drain_after_a_413_is_bounded():
    with hostile_broker({"max-request-bytes": 1 * MiB}) as (b, g):
        s = raw_socket(b)
        try:
            s.sendall(f"POST /faye HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {1 << 40}\r\n\r\n".encode())
            chunk = b"1," * (128 * 1024)
            t0 = time.monotonic()
            sent = send_for(s, lambda: chunk, 20)
            elapsed = time.monotonic() - t0
            assert elapsed < 19, (f"the broker still took a body it refused after {elapsed:.0f}s "
                                  f"({sent / MiB:.0f} MiB): the drain after a 413 must be bounded")
        finally:
            s.close()
        g.assert_served()
        g.assert_rss()
        g.assert_fds_back()


def test_404_has_nosniff_and_does_not_echo_the_path():
    with hostile_broker() as (b, g):
        for path in ["/xyzzy%3Cscript%3Ealert(1)%3C/script%3E", "/faye/xyzzy%3Cb%3E.js", "/faye/xyzzy.map"]:
            s = raw_socket(b)
            try:
                status, headers, body = _exchange(s, "GET", path, b.port)
                length = int(headers.get("content-length", "0"))
                if len(body) < length:
                    body += read_more(s, 0.5)
            finally:
                s.close()
            assert status == 404, (path, status)
            assert headers.get("x-content-type-options") == "nosniff", (path, headers)
            lowered = body.lower()
            assert b"xyzzy" not in lowered and b"script" not in lowered and b"%3c" not in lowered, \
                f"the 404 of {path} echoes it: {body[:200]!r}"
        g.assert_served()
