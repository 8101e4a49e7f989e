"""WebSocket compression (permessage-deflate) with the served browser client (`/faye/client.js`) in headless Chromium.

The page connects over WebSocket and receives a large job-progress event, which the broker sends compressed. The
negotiated extension is read twice: in the page, from the browser client's own WebSocket object
(`client._socket._ws.extensions`: the client keeps its `Socket` transport in `_socket` and the browser's WebSocket
in its `_ws`, see client/client.js), and from the DevTools protocol's record of the upgrade response
(`Network.webSocketHandshakeResponseReceived`), beside what Chromium offered. Headless Firefox is in
test_browser_firefox.py, whose harness is its own.
"""

import json

import pytest

from pubsubtest.bayeux import publish_all
from pubsubtest.compression import ANSWER, job_progress

TIMEOUT = 15

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>pubsub compression</title>
<script src="{broker}/client.js"></script>
</head><body><pre id="out"></pre>
<script>
window.received = [];
var client = new Faye.Client({broker_json}, {{timeout: 10}});
client.subscribe('/jobs/progress', function (data) {{ received.push(data); }})
  .then(function () {{ window.subscribed = true; }}, function (e) {{ window.subscribeError = String(e); }});
function negotiated() {{
  var ws = client._socket && client._socket._ws;
  return ws && ws.readyState === 1 ? {{extensions: ws.extensions, url: ws.url}} : null;
}}
</script></body></html>
"""


def publish(broker, data):
    publish_all(broker, "/jobs/progress", [data], timeout=TIMEOUT)


def handshake_headers(page, broker):
    """(request headers, response headers) of the page's WebSocket upgrade to the broker, names in lower case."""
    created = {p["requestId"] for p in page.network("Network.webSocketCreated") if p["url"] == broker.ws_url}
    assert created, page.network("Network.webSocketCreated")
    sent = [p for p in page.network("Network.webSocketWillSendHandshakeRequest") if p["requestId"] in created]
    got = [p for p in page.network("Network.webSocketHandshakeResponseReceived") if p["requestId"] in created]
    assert sent and got, (sent, got)
    request = {k.lower(): v for k, v in sent[-1]["request"]["headers"].items()}
    response = got[-1]["response"]
    assert response["status"] == 101, response
    return request, {k.lower(): v for k, v in response["headers"].items()}


def open_page(page, page_server, broker, name):
    html = PAGE.format(broker=broker.url, broker_json=json.dumps(broker.url))
    page.navigate(page_server.add(f"/{name}.html", html))
    page.wait_for("window.subscribed || window.subscribeError", timeout=TIMEOUT, what="the subscription")
    assert page.evaluate("window.subscribeError || null") is None
    assert page.evaluate("client.getTransport()") == "websocket"


def test_chromium_negotiates_permessage_deflate_and_receives_a_large_event(page, page_server, make_broker):
    b = make_broker(timeout=10)
    open_page(page, page_server, b, "compression-on")
    socket = page.wait_for("negotiated()", what="the client's open WebSocket")
    assert socket == {"extensions": ANSWER, "url": b.ws_url}, socket

    request, response = handshake_headers(page, b)
    assert request.get("sec-websocket-extensions", "").startswith("permessage-deflate"), request
    assert response.get("sec-websocket-extensions") == ANSWER, response

    large = job_progress(4096, job="encode-9", step=21)
    short = {"job": "encode-9", "percent": 52.5}
    publish(b, large)
    publish(b, short)
    page.wait_for("received.length >= 2", what="the large and the short event")
    assert page.evaluate("received") == [large, short]
    # What Chromium handed the page is what came off the wire, inflated: the frame carries the event alone.
    frames = [json.loads(p["response"]["payloadData"]) for p in page.network("Network.webSocketFrameReceived")]
    events = [m for f in frames for m in (f if isinstance(f, list) else [f]) if m.get("channel") == "/jobs/progress"]
    assert [m["data"] for m in events] == [large, short], events


def test_chromium_gets_no_extension_when_compression_is_off(page, page_server, make_broker):
    b = make_broker(timeout=10, extra_args=["--websocket-compression", "off"])
    open_page(page, page_server, b, "compression-off")
    socket = page.wait_for("negotiated()", what="the client's open WebSocket")
    assert socket == {"extensions": "", "url": b.ws_url}, socket
    request, response = handshake_headers(page, b)
    assert request.get("sec-websocket-extensions", "").startswith("permessage-deflate"), request
    assert "sec-websocket-extensions" not in response, response
    large = job_progress(4096)
    publish(b, large)
    page.wait_for("received.length >= 1")
    assert page.evaluate("received") == [large]


@pytest.mark.parametrize("size", [300, 70_000])
def test_chromium_receives_events_around_and_far_above_the_minimum(page, page_server, make_broker, size):
    b = make_broker(timeout=10)
    open_page(page, page_server, b, f"compression-{size}")
    data = job_progress(size, step=size % 40)
    publish(b, data)
    page.wait_for("received.length >= 1")
    assert page.evaluate("received") == [data]
    assert page.evaluate("negotiated().extensions") == ANSWER
