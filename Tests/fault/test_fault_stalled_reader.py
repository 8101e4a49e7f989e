"""A WebSocket reader that stops reading (the proxy stops passing the broker's bytes on, so the broker's writes
pile up in the kernel's buffers, then in its own) is closed by the broker once its writes have been blocked for
--send-timeout: the broker does not keep writing into a socket nobody reads."""

import json
import re
import urllib.request

import pytest
import requests
import websocket

from pubsubtest.faultproxy import FaultProxy
from pubsubtest.wait import wait_until

SEND_TIMEOUT = 2
CHANNEL = "/fault/stalled"
WS_CLIENTS = re.compile(r'^pubsub_clients\{transport="websocket"\} ([0-9.e+]+)$', re.M)


def websocket_clients(broker):
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.port}/metrics", timeout=5) as r:
        m = WS_CLIENTS.search(r.read().decode())
    return int(float(m.group(1))) if m else 0


def exchange(ws, messages, until):
    ws.send(json.dumps(messages))
    got = []
    while not until(got):
        got.extend(json.loads(ws.recv()))
    return got


@pytest.mark.pending("a stalled WebSocket reader closed within --send-timeout")
@pytest.mark.timeout(60)
def test_stalled_websocket_reader_is_closed(make_broker):
    broker = make_broker(timeout=5, target="pubsub",
                         extra_args=["--send-timeout", str(SEND_TIMEOUT), "--max-queue", "100000"])
    with FaultProxy(("127.0.0.1", broker.port)) as proxy:
        ws = websocket.create_connection(proxy.ws_url, timeout=10)
        try:
            cid = exchange(ws, [{"channel": "/meta/handshake", "version": "1.0",
                                 "supportedConnectionTypes": ["websocket"]}],
                           lambda got: got)[0]["clientId"]
            exchange(ws, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": CHANNEL, "id": "s"}],
                     lambda got: any(m.get("id") == "s" for m in got))
            connect = {"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket"}
            exchange(ws, [dict(connect, id="c1")], lambda got: any(m.get("id") == "c1" for m in got))
            ws.send(json.dumps([dict(connect, id="c2")]))  # held: the socket is the session's now
            wait_until(lambda: websocket_clients(broker) == 1, 5, message="the WebSocket attached")

            assert proxy.stall() == 1  # until the end of the test: the reader has stopped
            pad = "x" * 16000
            published = 0
            for batch in range(30):  # 300 events of 16 KB: far more than the kernel's buffers hold
                body = [{"channel": CHANNEL, "data": {"n": batch * 10 + i, "pad": pad}} for i in range(10)]
                r = requests.post(broker.url, json=body, timeout=10)
                assert r.status_code == 200 and all(m.get("successful") for m in r.json()), r.text[:300]
                published += len(body)
            closed = wait_until(lambda: websocket_clients(broker) == 0, SEND_TIMEOUT + 10, raises=False,
                                message="the stalled WebSocket closed")
            print(f"stalled reader: {published} events of 16 KB published; proxy {proxy.counters()}; "
                  f"closed by the broker: {closed}")
            assert closed, (f"the broker still holds the WebSocket of a reader stalled for over "
                            f"{SEND_TIMEOUT + 10}s with --send-timeout {SEND_TIMEOUT}:\n{broker.log()[-2000:]}")
        finally:
            ws.close(timeout=1)
