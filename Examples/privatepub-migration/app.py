"""Stands in for the Rails side of a PrivatePub app, doing exactly what the private_pub gem does:

- `subscribe_to "/messages/new"` in a view: a script tag calling PrivatePub.sign({server, timestamp, channel,
  signature}) with signature = sha1(secret_token + channel + timestamp), timestamp in milliseconds;
- `PrivatePub.publish_to(channel, data)`: a form POST of one `message` field to the server, carrying the
  secret token in ext. A string is sent as JavaScript for the browsers to run ({"eval": ...}), anything else
  as {"data": ...}.

Both read config/private_pub.yml (or $PRIVATE_PUB_CONFIG), section $RAILS_ENV, as the gem does.

  python3 app.py               serve the chat on $PORT (3000)
  python3 app.py --broker-port print the port of the configured server
"""

import hashlib
import json
import os
import sys
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.environ.get("PRIVATE_PUB_CONFIG", os.path.join(HERE, "config", "private_pub.yml"))
ENVIRONMENT = os.environ.get("RAILS_ENV", "development")
PORT = int(os.environ.get("PORT", "3000"))


def load_config(path, environment):
    """The flat two-level YAML of private_pub.yml: `env:` sections holding `key: value` lines."""
    sections, current = {}, None
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split(" #", 1)[0].rstrip()
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if not line.startswith((" ", "\t")):
                current = sections.setdefault(line.rstrip(":").strip(), {})
            elif current is not None:
                key, _, value = line.strip().partition(":")
                current[key.strip()] = value.strip().strip('"').strip("'")
    if environment not in sections:
        raise SystemExit(f"{path}: no section for environment {environment!r}")
    return sections[environment]


CONF = load_config(CONFIG, ENVIRONMENT)
SERVER, SECRET = CONF["server"], CONF["secret_token"]


def subscription(channel):
    """What the gem's `subscribe_to` helper renders into the page."""
    timestamp = int(time.time() * 1000)
    signature = hashlib.sha1(f"{SECRET}{channel}{timestamp}".encode()).hexdigest()
    return {"server": SERVER, "timestamp": timestamp, "channel": channel, "signature": signature}


def publish_to(channel, data):
    """PrivatePub.publish_to: a form POST with `message` = the JSON, as Net::HTTP.post_form sends it."""
    payload = {"channel": channel, "eval": data} if isinstance(data, str) else {"channel": channel, "data": data}
    message = {"channel": channel, "data": payload, "ext": {"private_pub_token": SECRET}}
    body = urllib.parse.urlencode({"message": json.dumps(message)}).encode()
    with urllib.request.urlopen(urllib.request.Request(SERVER, data=body), timeout=10) as r:
        r.read()


MESSAGES = 0


class App(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/":
            with open(os.path.join(HERE, "index.html"), encoding="utf-8") as f:
                page = f.read()
            page = page.replace("{{SUBSCRIBE_TO_MESSAGES}}", json.dumps(subscription("/messages/new")))
            page = page.replace("{{SUBSCRIBE_TO_NOTICES}}", json.dumps(subscription("/notices")))
            return self.reply(200, "text/html; charset=utf-8", page)
        if self.path == "/private_pub.js":
            with open(os.path.join(HERE, "public", "private_pub.js"), encoding="utf-8") as f:
                return self.reply(200, "text/javascript; charset=utf-8", f.read())
        self.reply(404, "text/plain", "not found")

    def do_POST(self):
        global MESSAGES
        if self.path != "/messages":
            return self.reply(404, "text/plain", "not found")
        length = int(self.headers.get("Content-Length", "0"))
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        body = form.get("body", [""])[0].strip()[:500]
        if body:
            MESSAGES += 1
            # create.js.erb of the classic PrivatePub chat: JavaScript that every subscribed browser runs.
            publish_to("/messages/new",
                       "var li = document.createElement('li'); li.textContent = " + json.dumps(body) + ";"
                       " document.getElementById('chat').appendChild(li);")
            publish_to("/notices", {"messages": MESSAGES, "last": body})
        self.reply(204, "text/plain", "")

    def reply(self, status, content_type, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        pass


if __name__ == "__main__":
    if sys.argv[1:] == ["--broker-port"]:
        print(urllib.parse.urlsplit(SERVER).port or 80)
        sys.exit(0)
    server = ThreadingHTTPServer(("127.0.0.1", PORT), App)
    print(f"privatepub-migration: open http://localhost:{PORT}/ (broker {SERVER}, {ENVIRONMENT})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
