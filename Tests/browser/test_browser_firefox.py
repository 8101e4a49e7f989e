"""The browser client in headless Firefox (Debian's `firefox-esr`), on a page from another origin than the broker.

Firefox is driven without WebDriver: it opens the page, and the page reports what happens (subscribed, each
message received, its own publishes coming back, the transport in use) by POSTing JSON to the test's own server,
which is also the page's origin (numbered, as their requests may arrive in any order). Each transport the client offers is checked: WebSocket, CORS long-polling and
JSON-P callback-polling, with messages in order both ways and a broker restart in the middle.
"""

import json
import os
import shutil
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from pubsubtest.bayeux import publish_all
from pubsubtest.compression import job_progress
from pubsubtest.process import stop_group
from pubsubtest.wait import wait_until

FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")

pytestmark = pytest.mark.skipif(FIREFOX is None, reason="firefox-esr is not installed (scripts/install-test-deps)")

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>pubsub client in Firefox</title>
<script src="{broker}/client.js"></script>
</head><body><pre id="out"></pre>
<script>
var reports = 0;
function report(what) {{
  // Numbered when made: the requests may arrive in any order (the server sorts them).
  what.seq = reports++;
  fetch('/report', {{method: 'POST', headers: {{'Content-Type': 'application/json'}}, body: JSON.stringify(what)}});
}}
window.onerror = function (message) {{ report({{error: String(message)}}); }};
var client = new Faye.Client({broker_json}, {{timeout: 10}});
{setup}
client.bind('transport:up', function () {{ report({{up: true}}); }});
client.bind('transport:down', function () {{ report({{down: true}}); }});
// Every subscribe the broker confirms, the first and those the client makes again after a new handshake.
client.addExtension({{
  incoming: function (message, callback) {{
    if (message.channel === '/meta/subscribe' && message.successful && message.subscription === '/chat/room') {{
      report({{subscribed: client.getTransport()}});
    }}
    callback(message);
  }}
}});
var own = 0;
client.subscribe('/order/page', function (n) {{
  report({{own: n}});
}}).then(function () {{
  client.subscribe('/chat/room', function (data) {{
    report({{received: data}});
    if (data === 'publish') {{
      for (var i = 0; i < 20; i++) client.publish('/order/page', i);
    }}
  }}).then(null, function (e) {{ report({{error: 'subscribe: ' + e}}); }});
}}, function (e) {{ report({{error: 'subscribe: ' + e}}); }});
</script></body></html>
"""


class ReportServer:
    """Serves the page and collects what it POSTs to /report, in order."""

    def __init__(self, page):
        self.reports = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = page.encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                report = json.loads(self.rfile.read(length))
                with server.lock:
                    server.reports.append(report)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/page.html"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def all(self):
        """The reports in the order the page made them."""
        with self.lock:
            return sorted(self.reports, key=lambda r: r["seq"])

    def values(self, key):
        return [r[key] for r in self.all() if key in r]

    def wait(self, predicate, what, timeout=30):
        def ready():
            errors = self.values("error")
            assert not errors, errors
            return predicate(self)

        if not wait_until(ready, timeout, raises=False):
            raise AssertionError(f"Firefox: no {what} within {timeout} s; the page reported {self.all()}")

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Firefox:
    """Headless Firefox with a fresh profile (no first-run pages, no updates, no telemetry) showing one URL."""

    PREFS = {
        "browser.shell.checkDefaultBrowser": False,
        "browser.startup.homepage_override.mstone": "ignore",
        "browser.aboutwelcome.enabled": False,
        "datareporting.policy.dataSubmissionEnabled": False,
        "toolkit.telemetry.reportingpolicy.firstRun": False,
        "app.update.disabledForTesting": True,
        "network.proxy.type": 0,
    }

    def __init__(self, url):
        self.profile = tempfile.mkdtemp(prefix="pubsub-firefox-")
        with open(os.path.join(self.profile, "user.js"), "w") as f:
            for name, value in self.PREFS.items():
                f.write(f"user_pref({json.dumps(name)}, {json.dumps(value)});\n")
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, MOZ_HEADLESS="1", HOME=self.profile)
        self.proc = subprocess.Popen([FIREFOX, "--headless", "--no-remote", "--profile", self.profile, url],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def output(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-3000:]

    def close(self):
        stop_group(self.proc)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def wait_subscribed(server, firefox):
    """Waits for the page's first subscription; a timeout says what Firefox printed."""
    try:
        server.wait(lambda s: s.values("subscribed"), "subscription", timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}\nfirefox:\n{firefox.output()}") from None


SETUP = {
    "websocket": "",
    "cross-origin-long-polling": "client.disable('websocket');",
    "callback-polling": "client.disable('websocket'); client.disable('cross-origin-long-polling');",
}


@pytest.mark.parametrize("transport", list(SETUP))
def test_firefox_client_both_ways_and_across_a_broker_restart(make_broker, transport):
    b = make_broker(timeout=10)
    page = PAGE.format(broker=b.url, broker_json=json.dumps(b.url), setup=SETUP[transport])
    server = ReportServer(page)
    firefox = Firefox(server.url)
    try:
        wait_subscribed(server, firefox)
        assert server.values("subscribed") == [transport]
        assert server.values("up"), server.all()

        # Messages from the server arrive in order; the page's own publishes leave and come back in order.
        publish_all(b, "/chat/room", list(range(30)) + ["publish"])
        server.wait(lambda s: len(s.values("received")) >= 31 and len(s.values("own")) >= 20, "31 messages and 20 own")
        assert server.values("received") == list(range(30)) + ["publish"]
        assert server.values("own") == list(range(20))

        # The broker restarts on its port: the client handshakes again, subscribes again, and goes on.
        b.restart()
        server.wait(lambda s: len(s.values("subscribed")) >= 2, "subscription after the restart", timeout=45)
        publish_all(b, "/chat/room", ["after the restart"])
        server.wait(lambda s: "after the restart" in s.values("received"), "a message after the restart")
        assert server.values("received")[-1] == "after the restart"
        assert server.values("subscribed") == [transport, transport]
        assert server.values("down"), "the restart was seen as the transport going down"
    finally:
        firefox.close()
        server.close()


# ---- WebSocket compression (permessage-deflate): the extension Firefox negotiated, read in the page from the browser
# client's own WebSocket (`client._socket._ws.extensions`, see client/client.js), and a large event received. Firefox
# names the extension alone in `.extensions` ("permessage-deflate"), without the parameters of the server's answer
# (Chromium gives the whole answer; test_browser_compression.py).

COMPRESSION_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>pubsub compression in Firefox</title>
<script src="{broker}/client.js"></script>
</head><body>
<script>
var reports = 0;
function report(what) {{
  what.seq = reports++;
  fetch('/report', {{method: 'POST', headers: {{'Content-Type': 'application/json'}}, body: JSON.stringify(what)}});
}}
window.onerror = function (message) {{ report({{error: String(message)}}); }};
var client = new Faye.Client({broker_json}, {{timeout: 10}});
client.subscribe('/jobs/progress', function (data) {{ report({{received: data}}); }}).then(function () {{
  var ws = client._socket && client._socket._ws;
  report({{subscribed: client.getTransport(),
           socket: ws ? {{extensions: ws.extensions, readyState: ws.readyState, url: ws.url}} : null}});
}}, function (e) {{ report({{error: 'subscribe: ' + e}}); }});
</script></body></html>
"""


@pytest.mark.parametrize("compression", ["on", "off"])
def test_firefox_negotiates_permessage_deflate_and_receives_a_large_event(make_broker, compression):
    b = make_broker(timeout=10, extra_args=["--websocket-compression", compression])
    server = ReportServer(COMPRESSION_PAGE.format(broker=b.url, broker_json=json.dumps(b.url)))
    firefox = Firefox(server.url)
    try:
        wait_subscribed(server, firefox)
        assert server.values("subscribed") == ["websocket"], server.all()
        socket = server.values("socket")[0]
        expected = "permessage-deflate" if compression == "on" else ""
        assert socket == {"extensions": expected, "readyState": 1, "url": b.ws_url}, socket

        large = job_progress(4096, job="encode-9", step=21)
        publish_all(b, "/jobs/progress", [large, {"job": "encode-9", "percent": 52.5}])
        server.wait(lambda s: len(s.values("received")) >= 2, "the large and the short event")
        assert server.values("received") == [large, {"job": "encode-9", "percent": 52.5}]
    finally:
        firefox.close()
        server.close()
