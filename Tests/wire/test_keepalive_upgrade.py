"""A WebSocket upgrade on a keep-alive connection that already served requests (as pooled HTTP clients such as
aiohttp send it: the handshake POST, then the upgrade on the same connection) must be upgraded, not refused."""

import json
import socket

from websocket import create_connection

from pubsubtest.broker import Broker
from pubsubtest.websocket import upgrade_request

HANDSHAKE = {"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["websocket"]}


def read_response(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before a response"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        rest += sock.recv(65536)
    return head.split(b"\r\n")[0], rest[:length]


def post(sock, port, body):
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /faye HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (port, len(payload), payload))
    status, body = read_response(sock)
    assert b" 200 " in status, status
    return json.loads(body)


def test_upgrade_after_requests_on_the_same_connection():
    with Broker(timeout=5) as b:
        sock = socket.create_connection(("127.0.0.1", b.port), timeout=5)
        cid = post(sock, b.port, HANDSHAKE)[0]["clientId"]
        post(sock, b.port, {"channel": "/meta/subscribe", "clientId": cid, "subscription": "/k"})
        ws = create_connection(b.ws_url, socket=sock, timeout=5)
        try:
            ws.send(json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket"}]))
            assert json.loads(ws.recv())[0]["successful"] is True
            ws.send(json.dumps([{"channel": "/k", "data": "over the upgraded socket"}]))
            got = []
            while not any(m.get("data") == "over the upgraded socket" for m in got):
                got += json.loads(ws.recv())
        finally:
            ws.close()


def test_upgrade_to_another_path_on_a_used_connection_is_still_refused():
    with Broker(timeout=5) as b:
        sock = socket.create_connection(("127.0.0.1", b.port), timeout=5)
        post(sock, b.port, HANDSHAKE)
        sock.sendall(upgrade_request(b.port, path="/elsewhere", host="x"))
        status, _ = read_response(sock)
        assert b" 404 " in status, status
        sock.close()
