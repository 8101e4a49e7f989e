"""The web app of the team-rooms example: a back end that is not Rails (Python standard library only).

  GET  /?user=alice         the page, logged in as that user (a real app would have a login form and a session)
  GET  /token?user=alice    a fresh connection JWT for the user (the page's `token` function calls it before
                            every handshake)
  POST /rooms/<room>        posts a message to a room: the app publishes it with a token of its own
  POST /pubsub/authorize    the broker's authorization hook: may this user subscribe to this room?

The JWT (HS256, signed here with the standard library) names the user (`sub`) and grants the user's own inbox
(`channels: ["/users/<user>/**"]`); it expires after TOKEN_SECONDS. Rooms are not in the token: who is in which
room changes, so the broker asks the app (the hook) at each subscription, with the user the token established.
"""

import base64
import hashlib
import hmac
import json
import os
import re
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
JWT_KEY = os.environ["PUBSUB_JWT_KEY"].encode()
BROKER_URL = os.environ.get("BROKER_URL", "http://localhost:9292/faye")
PORT = int(os.environ.get("PORT", "8000"))
TOKEN_SECONDS = int(os.environ.get("TOKEN_SECONDS", "600"))
USERS = {"alice", "bob"}
MEMBERS = {"ops": {"alice"}, "lobby": {"alice", "bob"}}


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def jwt_hs256(claims):
    signing_input = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + b"." + b64(json.dumps(claims).encode())
    return (signing_input + b"." + b64(hmac.new(JWT_KEY, signing_input, hashlib.sha256).digest())).decode()


def connection_token(user):
    return jwt_hs256({"sub": user, "exp": int(time.time()) + TOKEN_SECONDS, "channels": [f"/users/{user}/**"]})


def publish(channel, data):
    """The app's own publish: a short-lived token whose `publish` claim covers the channel."""
    token = jwt_hs256({"sub": "team-rooms-app", "exp": int(time.time()) + 30, "publish": [channel]})
    body = json.dumps([{"channel": channel, "data": data, "ext": {"token": token}}]).encode()
    request = urllib.request.Request(BROKER_URL, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)[0]


def authorize(question):
    """The hook: rooms are for their members; anything else this app does not grant."""
    m = re.fullmatch(r"/rooms/([a-z]+)", question.get("channel") or "")
    if question.get("action") != "subscribe" or not m:
        return {"allow": False, "error": "Not a room"}
    room = m.group(1)
    if question.get("user") in MEMBERS.get(room, set()):
        return {"allow": True}
    return {"allow": False, "error": f"Not a member of {room}"}


class App(BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        user = urllib.parse.parse_qs(url.query).get("user", [""])[0]
        if url.path == "/" and user in USERS:
            with open(os.path.join(HERE, "index.html"), encoding="utf-8") as f:
                page = f.read().replace("{{BROKER_URL}}", BROKER_URL).replace("{{USER}}", user)
            return self.reply(200, "text/html; charset=utf-8", page)
        if url.path == "/token" and user in USERS:
            return self.reply(200, "text/plain", connection_token(user))
        self.reply(404, "text/plain", "not found (try /?user=alice or /?user=bob)")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")) or 0)
        if self.path == "/pubsub/authorize":
            return self.reply(200, "application/json", json.dumps(authorize(json.loads(body or b"{}"))))
        m = re.fullmatch(r"/rooms/([a-z]+)", self.path)
        if m and m.group(1) in MEMBERS:
            text = json.loads(body or b"{}").get("text", "")
            reply = publish(f"/rooms/{m.group(1)}", {"text": text, "at": int(time.time())})
            return self.reply(200 if reply.get("successful") else 502, "application/json", json.dumps(reply))
        self.reply(404, "text/plain", "not found")

    def reply(self, status, content_type, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", PORT), App)
    print(f"team-rooms: open http://localhost:{PORT}/?user=alice (broker {BROKER_URL})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
