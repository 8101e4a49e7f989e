"""The browser client in headless Chromium, on a page from another origin than the broker.

Each page is served by the test's own HTTP server on its own port, loads `<broker>/faye/client.js` (or
`<broker>/faye.js`, as PrivatePub does) and talks to the broker cross-origin: WebSocket, CORS long-polling,
JSON-P callback-polling, a broker restart, and PrivatePub's browser API.
"""

import hashlib
import json
import time

import pytest

from pubsubtest.bayeux import bayeux, post_form, publish_all
from pubsubtest.faultproxy import FaultProxy


TIMEOUT = 10

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>pubsub client test</title>
<script src="{broker}/client.js"></script>
</head><body><h1>pubsub client test</h1><pre id="out"></pre>
<script>
window.received = [];
window.events = [];
window.subscribes = 0;
{before}
var client = new Faye.Client({broker_json}, {options});
{setup}
client.bind('transport:up', function () {{ events.push('up'); }});
client.bind('transport:down', function () {{ events.push('down'); }});
client.addExtension({{
  incoming: function (message, callback) {{
    if (message.channel === '/meta/subscribe' && message.successful) window.subscribes++;
    callback(message);
  }}
}});
var subscription = client.subscribe('/chat/room', function (data) {{
  received.push(data);
  document.getElementById('out').textContent += JSON.stringify(data) + '\\n';
}});
subscription.then(function () {{ window.subscribed = true; }}, function (e) {{ window.subscribeError = String(e); }});
</script></body></html>
"""

# A WebSocket that never opens, as behind a proxy that refuses upgrades.
BLOCK_WEBSOCKET = """
window.WebSocket = function () {
  var self = this;
  setTimeout(function () { if (self.onerror) self.onerror({}); if (self.onclose) self.onclose({}); }, 20);
};
window.WebSocket.prototype.send = function () { throw new Error('not open'); };
window.WebSocket.prototype.close = function () {};
"""


def open_client_page(page, page_server, broker, name, options=None, setup="", before="", timeout=15):
    html = PAGE.format(broker=broker.url, broker_json=json.dumps(broker.url), options=json.dumps(options or {}),
                       setup=setup, before=before)
    page.navigate(page_server.add(f"/{name}.html", html))
    page.wait_for("window.subscribed || window.subscribeError", timeout=timeout, what="the subscription")
    assert page.evaluate("window.subscribeError || null") is None
    return page


def broker_requests(page, broker):
    return [r for r in page.requests() if r["url"].startswith(broker.url)]


def test_websocket_cross_origin(page, page_server, make_broker):
    b = make_broker(timeout=10)
    open_client_page(page, page_server, b, "websocket")
    assert page.evaluate("client.getTransport()") == "websocket"
    assert page.evaluate("location.origin") != b.url[: -len("/faye")], "the page must be on another origin"
    publish_all(b, "/chat/room", {"text": "hello over WebSocket"})
    page.wait_for("received.length >= 1")
    assert page.evaluate("received") == [{"text": "hello over WebSocket"}]
    assert page.websockets() == [b.ws_url]
    assert page.evaluate("events") == ["up"]
    # The handshake crossed origins by plain HTTP before the switch to WebSocket.
    handshake = [r for r in broker_requests(page, b) if r["url"].split("?")[0] == b.url]
    assert handshake, page.requests()


@pytest.mark.parametrize("transport", ["cross-origin-long-polling", "callback-polling"])
def test_polling_when_websocket_is_disabled(page, page_server, make_broker, transport):
    b = make_broker(timeout=10)
    setup = "client.disable('websocket');"
    if transport == "callback-polling":
        setup += "client.disable('cross-origin-long-polling');"
    open_client_page(page, page_server, b, f"polling-{transport}", setup=setup)
    assert page.evaluate("client.getTransport()") == transport
    publish_all(b, "/chat/room", {"text": "hello by polling"})
    page.wait_for("received.length >= 1")
    assert page.evaluate("received") == [{"text": "hello by polling"}]
    assert page.websockets() == []
    methods = {r["method"] for r in broker_requests(page, b) if "/client.js" not in r["url"]}
    if transport == "callback-polling":
        assert methods == {"GET"}
        assert all("jsonp=__jsonp" in r["url"] for r in broker_requests(page, b) if "/client.js" not in r["url"])
    else:
        assert methods == {"POST"}

    # The page publishes too; the thenable resolves on the broker's acknowledgement, or rejects with its error.
    result = page.evaluate("client.publish('/chat/room', {text: 'from the page'}).then(function () { return 'ok'; })",
                           await_promise=True)
    assert result == "ok"
    page.wait_for("received.length >= 2")
    error = page.evaluate("client.publish('/chat/*', 1).then(function () { return 'ok'; }, "
                          "function (e) { return e.code + ' ' + e.message; })", await_promise=True)
    assert error == "405 Invalid channel"


# A WebSocket that neither opens nor fails, as behind a proxy that swallows the upgrade.
HANG_WEBSOCKET = """
window.WebSocket = function () {};
window.WebSocket.prototype.send = function () {};
window.WebSocket.prototype.close = function () {};
"""


@pytest.mark.parametrize("blocker", ["refused", "hanging"])
def test_falls_back_when_websocket_is_blocked(page, page_server, make_broker, blocker):
    b = make_broker(timeout=10)
    before = BLOCK_WEBSOCKET if blocker == "refused" else HANG_WEBSOCKET
    t0 = time.monotonic()
    open_client_page(page, page_server, b, f"blocked-{blocker}", before=before, timeout=25)
    if blocker == "hanging":
        assert 9 <= time.monotonic() - t0 < 20, "a socket that does not open is given up after 10 s"
    assert page.evaluate("client.getTransport()") == "cross-origin-long-polling"
    publish_all(b, "/chat/room", {"text": "after the fallback"})
    page.wait_for("received.length >= 1")
    assert page.evaluate("received") == [{"text": "after the fallback"}]


@pytest.mark.parametrize("transport", ["websocket", "cross-origin-long-polling", "callback-polling"])
def test_message_order_both_ways(page, page_server, make_broker, transport):
    b = make_broker(timeout=10)
    setup = {"websocket": "",
             "cross-origin-long-polling": "client.disable('websocket');",
             "callback-polling": "client.disable('websocket'); client.disable('cross-origin-long-polling');"}[transport]
    open_client_page(page, page_server, b, f"order-{transport}", setup=setup)
    publish_all(b, "/chat/room", list(range(40)))
    page.wait_for("received.length >= 40")
    assert page.evaluate("received") == list(range(40))
    # Publishes from the page leave in order and come back in order.
    page.evaluate("""
      window.own = [];
      client.subscribe('/order/page', function (n) { own.push(n); }).then(function () {
        for (var i = 0; i < 30; i++) client.publish('/order/page', i);
      });""")
    page.wait_for("own.length >= 30", what="30 messages published by the page")
    assert page.evaluate("own") == list(range(30))


def test_cancel_and_extensions(page, page_server, make_broker):
    b = make_broker(timeout=10)
    setup = """
      window.outgoing = [];
      window.answered = [];
      client.addExtension({outgoing: function (message, callback) {
        outgoing.push(message.channel);
        if (message.channel === '/chat/room' || message.channel === '/other') message.ext = {tag: 'x'};
        callback(message);
      }, incoming: function (message, callback) {
        if (message.successful) answered.push(message.channel);
        callback(message);
      }});"""
    open_client_page(page, page_server, b, "cancel", setup=setup)
    assert "/meta/handshake" in page.evaluate("outgoing") and "/meta/subscribe" in page.evaluate("outgoing")
    page.evaluate("window.other = []; window.otherSub = client.subscribe('/other', function (d) { other.push(d); }); true")
    page.evaluate("otherSub.then(function () { window.otherReady = true; }); true")
    page.wait_for("window.otherReady")
    publish_all(b, "/other", "one")
    page.wait_for("other.length === 1")
    page.evaluate("otherSub.cancel(); true")
    page.wait_for("answered.indexOf('/meta/unsubscribe') >= 0", what="the broker's answer to the unsubscribe")
    publish_all(b, "/other", "two")
    publish_all(b, "/chat/room", "still here")
    page.wait_for("received.length >= 1")
    assert page.evaluate("other") == ["one"], "a cancelled subscription gets nothing more"


@pytest.mark.parametrize("transport", ["websocket", "callback-polling"])
def test_broker_restart_rehandshakes_and_resubscribes(page, page_server, make_broker, transport):
    b = make_broker(timeout=10)
    setup = "" if transport == "websocket" else "client.disable('websocket'); client.disable('cross-origin-long-polling');"
    open_client_page(page, page_server, b, f"restart-{transport}", setup=setup)
    assert page.evaluate("client.getTransport()") == transport
    publish_all(b, "/chat/room", "before")
    page.wait_for("received.length >= 1")
    first_id = page.evaluate("client.getClientId()")

    b.restart()
    page.wait_for(f"client.getClientId() && client.getClientId() !== {json.dumps(first_id)}", timeout=30,
                  what="a new handshake after the restart")
    page.wait_for("window.subscribes >= 2", timeout=15, what="the subscription made again")
    publish_all(b, "/chat/room", "after")
    page.wait_for("received.length >= 2", timeout=15)
    assert page.evaluate("received") == ["before", "after"]
    assert page.evaluate("events") == ["up", "down", "up"]
    assert page.evaluate("client.getTransport()") == transport


PRIVATE_PUB_JS = """
// PrivatePub's browser API, written from PROTOCOL.md section 7.5: sign() stores the signed hash and loads
// <server>.js once; the client's outgoing extension adds the signature to /meta/subscribe.
var PrivatePub = (function (doc) {
  var self = {connecting: false, fayeClient: null, fayeCallbacks: [], subscriptions: {},
              subscriptionObjects: {}, subscriptionCallbacks: {}};
  self.faye = function (callback) {
    if (self.fayeClient) return callback(self.fayeClient);
    self.fayeCallbacks.push(callback);
    if (self.subscriptions.server && !self.connecting) {
      self.connecting = true;
      var script = doc.createElement('script');
      script.type = 'text/javascript';
      script.src = self.subscriptions.server + '.js';
      script.onload = self.connectToFaye;
      doc.documentElement.appendChild(script);
    }
  };
  self.connectToFaye = function () {
    self.fayeClient = new Faye.Client(self.subscriptions.server);
    self.fayeClient.addExtension(self.fayeExtension);
    for (var i = 0; i < self.fayeCallbacks.length; i++) self.fayeCallbacks[i](self.fayeClient);
  };
  self.fayeExtension = {
    outgoing: function (message, callback) {
      if (message.channel === '/meta/subscribe') {
        var signed = self.subscriptions[message.subscription];
        if (!message.ext) message.ext = {};
        message.ext.private_pub_signature = signed.signature;
        message.ext.private_pub_timestamp = signed.timestamp;
      }
      callback(message);
    }
  };
  self.sign = function (options) {
    if (!self.subscriptions.server) self.subscriptions.server = options.server;
    self.subscriptions[options.channel] = options;
    self.faye(function (faye) {
      self.subscriptionObjects[options.channel] = faye.subscribe(options.channel, self.handleResponse);
    });
  };
  self.handleResponse = function (message) {
    if (message.eval) eval(message.eval);
    var callback = self.subscriptionCallbacks[message.channel];
    if (callback) callback(message.data, message.channel);
  };
  self.subscription = function (channel) { return self.subscriptionObjects[channel]; };
  self.unsubscribe = function (channel) {
    var sub = self.subscription(channel);
    if (sub) { sub.cancel(); delete self.subscriptionObjects[channel]; }
  };
  self.subscribe = function (channel, callback) { self.subscriptionCallbacks[channel] = callback; };
  return self;
})(document);
"""


def signed(secret, server, channel, timestamp=None, signature=None):
    timestamp = timestamp if timestamp is not None else int(time.time() * 1000)
    if signature is None:
        signature = hashlib.sha1(f"{secret}{channel}{timestamp}".encode()).hexdigest()
    return {"server": server, "timestamp": timestamp, "channel": channel, "signature": signature}


def publish_to(broker, secret, channel, data):
    """What PrivatePub.publish_to sends: a form POST with one `message` field and the secret token."""
    payload = {"channel": channel, "eval": data} if isinstance(data, str) else {"channel": channel, "data": data}
    message = {"channel": channel, "data": payload, "ext": {"private_pub_token": secret}}
    replies = post_form(broker, message, timeout=TIMEOUT)
    assert replies[0]["successful"] is True, replies


def test_privatepub_browser_api(page, page_server, make_broker):
    secret = "s3cret"
    b = make_broker(timeout=10, secret=secret, signature_expiration=3600)
    good = signed(secret, b.url, "/messages/new")
    bad = signed(secret, b.url, "/messages/other", signature="0" * 40)
    html = f"""<!doctype html><html><head><meta charset="utf-8"><title>PrivatePub page</title>
<script>{PRIVATE_PUB_JS}</script></head><body><ul id="messages"></ul>
<script>
window.got = [];
PrivatePub.sign({json.dumps(good)});
PrivatePub.subscribe("/messages/new", function (data, channel) {{
  got.push([data, channel]);
  var li = document.createElement('li');
  li.textContent = JSON.stringify(data);
  document.getElementById('messages').appendChild(li);
}});
PrivatePub.sign({json.dumps(bad)});
</script></body></html>"""
    page.navigate(page_server.add("/privatepub.html", html))
    page.wait_for("!!PrivatePub.subscription('/messages/new')", what="faye.js loaded and subscribe called")
    outcome = "function (s) { return s.then(function () { return 'ok'; }, function (e) { return 'failed: ' + e; }); }"
    assert page.evaluate(f"({outcome})(PrivatePub.subscription('/messages/new'))", await_promise=True) == "ok"
    assert page.evaluate(f"({outcome})(PrivatePub.subscription('/messages/other'))", await_promise=True) \
        == "failed: Incorrect signature."
    assert any(r["url"] == b.url + ".js" for r in page.requests()), "PrivatePub loads <server>.js"

    publish_to(b, secret, "/messages/new", {"text": "signed hello"})
    page.wait_for("got.length >= 1")
    assert page.evaluate("got") == [[{"text": "signed hello"}, "/messages/new"]]
    publish_to(b, secret, "/messages/new", "window.evaluated = 6 * 7;")
    page.wait_for("window.evaluated === 42", what="the eval form of publish_to")

    # A browser cannot publish: it lacks the token.
    result = page.evaluate("PrivatePub.fayeClient.publish('/messages/new', {text: 'forged'})"
                           ".then(function () { return 'ok'; }, function (e) { return String(e); })",
                           await_promise=True)
    assert result == "Incorrect token."


def test_resume_after_the_session_is_lost(page, page_server, make_broker):
    """The session ends while messages are published; after its new handshake the client re-subscribes with
    the position of the last message it got (`ext.resume`) and receives exactly what it missed, in order."""
    b = make_broker(timeout=10)
    open_client_page(page, page_server, b, "resume",
                     setup="window.resumes = []; client.bind('resume', function (c, r) { resumes.push([c, r]); });")
    publish_all(b, "/chat/room", 1)
    page.wait_for("received.length >= 1")
    first_id = page.evaluate("client.getClientId()")
    # The broker forgets the session (as after an expiry or an overflow) and messages go on meanwhile.
    assert bayeux(b, [{"channel": "/meta/disconnect", "clientId": first_id}], timeout=TIMEOUT)[0]["successful"] is True
    publish_all(b, "/chat/room", [2, 3])
    page.wait_for(f"client.getClientId() && client.getClientId() !== {json.dumps(first_id)}", timeout=30,
                  what="a new handshake")
    page.wait_for("received.length >= 3", timeout=15, what="the missed messages")
    publish_all(b, "/chat/room", 4)
    page.wait_for("received.length >= 4", timeout=15)
    time.sleep(0.5)
    assert page.evaluate("received") == [1, 2, 3, 4]
    assert page.evaluate("resumes") == [["/chat/room", {"recovered": True, "missed": 2}]]


@pytest.mark.parametrize("transport", ["websocket", "cross-origin-long-polling"])
def test_resume_after_a_broken_connection_on_the_same_session(page, page_server, make_broker, transport):
    """While the session lives, the broker's answers are swallowed and the connection reset; then it is reset while
    messages are published. Each time the proxy is held down until the page saw the failure (a browser re-sends by
    itself a request whose reused connection was reset before any answer, and the page never knows: see
    docs/BROWSER.md). After each, the next connect goes out after a subscribe with `ext.resume`, in the same frame or
    request, and every message arrives once, in order."""
    b = make_broker(timeout=10)
    with FaultProxy(("127.0.0.1", b.port), record=True) as proxy:
        setup = "window.resumes = []; client.bind('resume', function (c, r) { resumes.push([c, r]); });"
        if transport != "websocket":
            setup += "client.disable('websocket');"
        open_client_page(page, page_server, proxy, f"reconnect-{transport}", options={"retry": 1}, setup=setup)
        assert page.evaluate("client.getTransport()") == transport
        publish_all(b, "/chat/room", 1)
        page.wait_for("received.length >= 1")
        session = page.evaluate("client.getClientId()")
        proxy.stall()                       # written by the broker, never delivered
        publish_all(b, "/chat/room", 2)
        proxy.reset(hold=True)
        page.wait_for("events.length === 2", what="the failure seen by the page")
        proxy.heal()
        page.wait_for("received.indexOf(2) >= 0", timeout=20, what="the message written to the broken connection")
        proxy.reset(hold=True)                # published meanwhile: queued on the session, and in the resumed range too
        publish_all(b, "/chat/room", [3, 4])
        page.wait_for("events.length === 4", what="the second failure seen by the page")
        proxy.heal()
        page.wait_for("resumes.length >= 2", timeout=20, what="the second resume")
        publish_all(b, "/chat/room", 5)
        # In order: a message delivered twice would come before the last one.
        page.wait_for("received.indexOf(5) >= 0", timeout=15, what="the last message")
        assert page.evaluate("received") == [1, 2, 3, 4, 5]
        assert page.evaluate("client.getClientId()") == session
        assert page.evaluate("events") == ["up", "down", "up", "down", "up"]
        answers = page.evaluate("resumes")
        assert [c for c, _ in answers] == ["/chat/room", "/chat/room"], answers
        assert all(a["recovered"] is True for _, a in answers), answers
        lists = proxy.sent()
        resumed = [messages for messages in lists if any(m.get("channel") == "/meta/subscribe" for m in messages)]
        assert len(resumed) == 3, lists         # the first subscribe, then a resume per reconnect
        for messages in resumed[1:]:
            assert [m["channel"] for m in messages] == ["/meta/subscribe", "/meta/connect"], messages
            assert messages[0]["ext"]["resume"] and messages[0]["clientId"] == session, messages
        assert resumed[1][0]["ext"]["resume"] != resumed[2][0]["ext"]["resume"]
