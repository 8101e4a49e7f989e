"""The web app of the sync-notifications example: a page per user, that user's notes as they are now, and the JWTs.

  GET /?user=alice          the page, logged in as that user (a real app would have a login form and a session)
  GET /token?user=alice     a connection JWT for the user: it grants subscribing to /users/alice/** and nothing else
  GET /notes?user=alice     the user's rows now, as JSON (the page loads them once subscribed)

  python3 app.py relay-token    prints the relay's JWT: it may publish to /users/**, and subscribe to nothing

The JWTs are HS256, signed here with the standard library and the key the broker verifies with
(PUBSUB_JWT_KEY). The broker checks a page's token once, when the page subscribes to its channel; the relay
publishes each change only to the channels of the row's owner (`--route public.notes=/users/{owner_id}/notes`).
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
JWT_KEY = os.environ["PUBSUB_JWT_KEY"].encode()
BROKER_URL = os.environ.get("BROKER_URL", "http://localhost:9292/faye")
PORT = int(os.environ.get("PORT", "8001"))
TOKEN_SECONDS = int(os.environ.get("TOKEN_SECONDS", "600"))
USERS = ("alice", "bob", "carol")
KEPT = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!~()@")


def channel_segment(value):
    """A value as one channel segment, escaped as the relay escapes it: letters, digits and -_!~()@ are kept,
    every other UTF-8 byte becomes $XX; the empty value is $."""
    return "".join(chr(b) if b in KEPT else f"${b:02X}" for b in value.encode()) or "$"


def notes_channel(user):
    """The channel the relay's route gives a row of this owner: /users/{owner_id}/notes."""
    return f"/users/{channel_segment(user)}/notes"


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def jwt_hs256(claims):
    signing_input = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + b"." + b64(json.dumps(claims).encode())
    return (signing_input + b"." + b64(hmac.new(JWT_KEY, signing_input, hashlib.sha256).digest())).decode()


def connection_token(user):
    """The page's token: its `sub`, and the user's own channels only. No `publish` claim: pages only listen."""
    return jwt_hs256({"sub": user, "exp": int(time.time()) + TOKEN_SECONDS,
                      "channels": [f"/users/{channel_segment(user)}/**"]})


def relay_token():
    """The relay's token: it publishes every user's changes; a TRUNCATE goes to the table's own channel, which no
    page may subscribe to. It has no `exp` because the relay runs as long as run.sh does, and the key is new each
    run; a real deployment gives the relay a key or token of its own and rotates it."""
    return jwt_hs256({"sub": "relay", "publish": ["/users/**", "/changes/public/notes"]})


def notes_of(user):
    import psycopg  # here, so that `app.py relay-token` needs no database driver

    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        return conn.execute("SELECT coalesce(json_agg(n ORDER BY id), '[]') FROM public.notes n WHERE owner_id = %s",
                            (user,)).fetchone()[0]


class App(BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        user = urllib.parse.parse_qs(url.query).get("user", [""])[0]
        if user not in USERS:
            return self.reply(404, "text/plain", "not found (try /?user=alice, /?user=bob or /?user=carol)")
        if url.path == "/":
            with open(os.path.join(HERE, "index.html"), encoding="utf-8") as f:
                page = (f.read().replace("{{BROKER_URL}}", BROKER_URL).replace("{{USER}}", user)
                        .replace("{{CHANNEL}}", notes_channel(user)))
            return self.reply(200, "text/html; charset=utf-8", page)
        if url.path == "/token":
            return self.reply(200, "text/plain", connection_token(user))
        if url.path == "/notes":
            return self.reply(200, "application/json", json.dumps(notes_of(user)))
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
    if sys.argv[1:] == ["relay-token"]:
        print(relay_token())
        sys.exit(0)
    server = ThreadingHTTPServer(("127.0.0.1", PORT), App)
    print(f"sync-notifications: open http://localhost:{PORT}/?user=alice and http://localhost:{PORT}/?user=bob"
          f" (broker {BROKER_URL})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
