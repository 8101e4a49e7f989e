"""Authorization in headless Chromium: the browser client's `token` function (a fresh JWT before every handshake)
on an allowed origin, and a page from an origin outside --allowed-origins that gets nowhere (CORS, WebSocket and,
with --disable-callback-polling, JSON-P are all refused)."""

import json
import time

import jwt
import pytest
from pubsubtest.bayeux import publish
from pubsubtest.wait import wait_until


HS_SECRET = "browser-auth-secret-0123456789abcdefghij"
CHANNEL = "/jobs/42"

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>pubsub auth test</title>
<script src="{broker}/client.js"></script>
</head><body><h1>pubsub auth test</h1><pre id="out"></pre>
<script>
window.received = [];
window.tokenCalls = 0;
window.tokens = {tokens};
var client = new Faye.Client({broker_json}, {{
  // What an app does: ask its back end for a fresh token before every handshake.
  token: function () {{
    window.tokenCalls++;
    return Promise.resolve(window.tokens.length > 1 ? window.tokens.shift() : window.tokens[0]);
  }}
}});
// Successful subscriptions, counted as the broker answers them (the client subscribes again after a new handshake).
window.subscriptions = 0;
client.addExtension({{incoming: function (message, callback) {{
  if (message.channel === '/meta/subscribe' && message.successful) window.subscriptions++;
  callback(message);
}}}});
client.subscribe({channel_json}, function (data) {{
  received.push(data);
  document.getElementById('out').textContent += JSON.stringify(data) + '\\n';
}}).then(function () {{ window.subscribed = true; }}, function (e) {{ window.subscribeError = String(e); }});
</script></body></html>
"""


def token(sub, ttl, **claims):
    payload = {"sub": sub, "exp": int(time.time()) + ttl}
    payload.update(claims)
    return jwt.encode(payload, HS_SECRET, algorithm="HS256")


def back_end_publish(b, data):
    publish(b, CHANNEL, data, ext={"token": token("app", 60, publish=[CHANNEL])})


def page_html(b, tokens):
    return PAGE.format(broker=b.url, broker_json=json.dumps(b.url), tokens=json.dumps(tokens),
                       channel_json=json.dumps(CHANNEL))


def test_token_function_gives_a_fresh_token_after_expiry(page, page_server, make_broker):
    b = make_broker(timeout=1, extra_args=["--jwt-key", HS_SECRET, "--allowed-origins", page_server.origin])
    short = token("42", 3, channels=[CHANNEL])
    longer = token("42", 120, channels=[CHANNEL])
    page.navigate(page_server.add("/fresh-token.html", page_html(b, [short, longer])))
    page.wait_for("window.subscribed || window.subscribeError", timeout=15, what="the subscription")
    assert page.evaluate("window.subscribeError || null") is None
    back_end_publish(b, "before expiry")
    page.wait_for("received.length >= 1", what="the first message")
    # The first token expires: the broker refuses the next connect, the client asks for a token again.
    page.wait_for("window.tokenCalls >= 2", timeout=15, what="a second handshake")
    page.wait_for("window.subscriptions >= 2", timeout=10, what="the new session's subscription")
    back_end_publish(b, "after expiry")
    page.wait_for("received.indexOf('after expiry') >= 0", timeout=10, what="a message after the re-handshake")
    assert page.evaluate("received") == ["before expiry", "after expiry"]


@pytest.mark.parametrize("websocket", [True, False])
def test_a_page_from_another_origin_is_refused(page, page_server, make_broker, websocket):
    b = make_broker(timeout=5, extra_args=["--jwt-key", HS_SECRET, "--allowed-origins", "https://app.example.com",
                                           "--disable-callback-polling", "--log-level", "debug"])
    page.navigate(page_server.add(f"/refused-{websocket}.html", page_html(b, [token("42", 60, channels=[CHANNEL])])))
    if not websocket:
        page.evaluate("client.disable('websocket')")
    wait_until(lambda: "origin refused" in b.log(), 15, message="the broker refusing the page's origin")
    back_end_publish(b, "secret")
    time.sleep(1)
    assert page.evaluate("window.subscribed || false") is False
    assert page.evaluate("received") == []
    assert page.evaluate("client._clientId") is None  # never handshook
    assert "origin refused" in b.log()
    # The broker's own view: no session was ever created for that page.
    assert "pubsub.origin=" + page_server.origin in b.log()
