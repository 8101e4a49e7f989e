"""--allowed-origins over CORS and WebSocket: allowed, refused, wildcard, absent; JSON-P off; the start warning."""

import json
import urllib.parse

import pytest
import requests
import websocket

from authkit import Broker, HS_SECRET, HTTP_TIMEOUT, assert_nothing_delivered, bayeux, client_id, connect, publish, \
    subscribe

ORIGINS = "https://app.example.com,https://*.example.org"


@pytest.fixture(scope="module")
def broker():
    with Broker(timeout=5, extra_args=["--allowed-origins", ORIGINS, "--disable-callback-polling"]) as b:
        yield b


def preflight(b, origin):
    return requests.options(b.url, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                            "Access-Control-Request-Headers": "content-type"}, timeout=HTTP_TIMEOUT)


@pytest.mark.parametrize("origin", ["https://app.example.com", "https://a.example.org", "https://a.b.example.org"])
def test_allowed_origins_get_cors(broker, origin):
    r = preflight(broker, origin)
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == origin
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    r = requests.post(broker.url, json=[{"channel": "/meta/handshake", "version": "1.0",
                                         "supportedConnectionTypes": ["long-polling"]}],
                      headers={"Origin": origin}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200 and r.json()[0]["successful"] is True
    assert r.headers["Access-Control-Allow-Origin"] == origin


@pytest.mark.parametrize("origin", ["https://evil.com", "http://app.example.com", "https://example.org",
                                    "https://app.example.com.evil.com", "null"])
def test_other_origins_are_refused_without_cors_headers(broker, origin):
    r = preflight(broker, origin)
    assert r.status_code == 403
    assert not [h for h in r.headers if h.lower().startswith("access-control-allow")], r.headers
    # A request sent anyway (a form post carries cookies) does nothing: a publish is not delivered.
    listener = client_id(broker)
    connect(broker, listener)
    assert subscribe(broker, listener, "/o/x")["successful"] is True
    r = requests.post(broker.url, json=[{"channel": "/o/x", "data": "forged"}], headers={"Origin": origin},
                      timeout=HTTP_TIMEOUT)
    assert r.status_code == 403
    assert not [h for h in r.headers if h.lower().startswith("access-control-allow")]
    assert_nothing_delivered(broker, listener)


def test_requests_without_origin_and_same_origin_are_unaffected(broker):
    cid = client_id(broker)
    host = broker.url.split("/")[2]
    reply = bayeux(broker, [{"channel": "/meta/handshake", "version": "1.0",
                             "supportedConnectionTypes": ["long-polling"]}], headers={"Origin": f"http://{host}"})
    assert reply[0]["successful"] is True
    assert cid


def ws_status(b, origin):
    try:
        if origin is None:
            ws = websocket.create_connection(b.ws_url, timeout=HTTP_TIMEOUT, suppress_origin=True)
        else:
            ws = websocket.create_connection(b.ws_url, timeout=HTTP_TIMEOUT, origin=origin)
    except websocket.WebSocketBadStatusException as e:
        return e.status_code
    ws.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["websocket"]}]))
    reply = json.loads(ws.recv())
    ws.close()
    assert reply[0]["successful"] is True
    return 101


@pytest.mark.parametrize("origin,status", [("https://app.example.com", 101), ("https://x.example.org", 101),
                                           (None, 101), ("https://evil.com", 403), ("https://example.org", 403)])
def test_websocket_upgrades_by_origin(broker, origin, status):
    assert ws_status(broker, origin) == status


def test_jsonp_can_be_turned_off(broker):
    message = urllib.parse.quote(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                              "supportedConnectionTypes": ["callback-polling"]}]))
    r = requests.get(f"{broker.url}?message={message}&jsonp=cb", timeout=HTTP_TIMEOUT)
    assert r.status_code == 403
    assert "cb(" not in r.text


def test_default_is_any_origin_and_auth_without_a_list_warns():
    with Broker(timeout=5) as b:
        r = preflight(b, "https://anything.test")
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "https://anything.test"
        assert ws_status(b, "https://anything.test") == 101
        assert "--allowed-origins" not in b.log()
    with Broker(timeout=5, extra_args=["--jwt-key", HS_SECRET]) as b:
        assert "any web origin may use the broker" in b.log()
