"""Helpers of the auth suites: tokens made by PyJWT, keys made by `cryptography`, a small real hook server, and
Bayeux over HTTP and WebSocket. Names are unique to this folder (no fixtures in conftest.py)."""

import json
import os
import tempfile
import threading
import time
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import websocket
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from pubsubtest.broker import Broker, pubsub_bin  # noqa: F401  (re-exported for the test modules)
from pubsubtest.bayeux import bayeux  # noqa: F401  (re-exported for the test modules)
from pubsubtest.bayeux import (connect as bayeux_connect, handshake as bayeux_handshake, publish as bayeux_publish,
                               subscribe as bayeux_subscribe)
from pubsubtest.ports import closed_port

HS_SECRET = "auth-suite-hs256-secret-0123456789abcdef"
HTTP_TIMEOUT = 10


# ---------------------------------------------------------------- keys and tokens

class Keys:
    """An RSA and a P-256 key pair, their public halves written as PEM files."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pubsub-auth-keys-")
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.rsa_public_pem = self._public_pem(self.rsa)
        self.ec_public_pem = self._public_pem(self.ec)
        self.rsa_file = self._write("rsa.pem", self.rsa_public_pem)
        self.ec_file = self._write("ec.pem", self.ec_public_pem)

    @staticmethod
    def _public_pem(key):
        return key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def _write(self, name, data):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path


def claims(sub="42", ttl=60, **extra):
    now = int(time.time())
    c = {"sub": sub, "exp": now + ttl}
    c.update(extra)
    return {k: v for k, v in c.items() if v is not None}


def hs256(payload, secret=HS_SECRET):
    return jwt.encode(payload, secret, algorithm="HS256")


def rs256(keys, payload):
    return jwt.encode(payload, keys.rsa, algorithm="RS256")


def es256(keys, payload):
    return jwt.encode(payload, keys.ec, algorithm="ES256")


def alg_none(payload):
    return jwt.encode(payload, None, algorithm="none")


def hs256_with_public_key_as_secret(pem, payload):
    """The RS/HS confusion attack: an HS256 token whose HMAC secret is the server's public key. PyJWT refuses
    to do this (it is the attack), so the token is assembled here with the standard library."""
    import base64
    import hashlib
    import hmac

    def b64(data):
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing_input = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + b"." + b64(json.dumps(payload).encode())
    signature = hmac.new(pem, signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + b64(signature)).decode()


# ---------------------------------------------------------------- Bayeux over HTTP

# The suite's messages carry ids (h, c, s, p) and their replies come back unasserted, for the test to judge;
# client_id is a handshake that must succeed, and connect one answered at once (advice_timeout=0, or the
# milliseconds given), returning (its reply, the events). A token goes in ext.token (token=...).
handshake = partial(bayeux_handshake, id="h", reply=True, check=False)
client_id = partial(bayeux_handshake, id="h")
connect = partial(bayeux_connect, advice_timeout=0, id="c", split=True)
subscribe = partial(bayeux_subscribe, id="s", check=False)
publish = partial(bayeux_publish, id="p", check=False)


class Listener:
    """A session that receives events: it subscribes with whatever credentials it is given; `events()` drains."""

    def __init__(self, b, channel, token=None, sub_token=None, ext=None):
        self.b = b
        self.cid = client_id(b, token=token)
        connect(b, self.cid)
        reply = subscribe(b, self.cid, channel, token=sub_token, ext=ext)
        assert reply["successful"] is True, reply

    def events(self, wait_ms=300):
        reply, events = connect(self.b, self.cid, advice_timeout=wait_ms)
        assert reply["successful"] is True, reply
        return events


def assert_nothing_delivered(b, cid, wait_ms=500):
    """The session gets no event (after a refusal: nothing was subscribed or published)."""
    reply, events = connect(b, cid, advice_timeout=wait_ms)
    assert reply["successful"] is True, reply
    assert events == [], events


# ---------------------------------------------------------------- WebSocket

def ws_open(b, headers=None):
    return websocket.create_connection(b.ws_url, timeout=HTTP_TIMEOUT, header=headers or [])


# ---------------------------------------------------------------- a small real hook server

class HookServer:
    """An HTTP server answering the broker's authorization questions by the channel's first segment:

    /allow/...   200 {"allow": true}
    /deny/...    200 {"allow": false, "error": "Not your job"}
    /slow/...    answers allow after `slow_seconds` (past the broker's timeout)
    /fail/...    500
    /garbage/... 200 with a body that is not JSON
    /jobs/<n>    allowed when the request's user is <n> (the app's own rule)
    handshake    allowed unless ext.password is "wrong"; the user is ext.user (or "anon")
    publish      allowed on /allow/..., refused otherwise
    Every question is recorded in `calls`.
    """

    def __init__(self, slow_seconds=3.0):
        self.calls = []
        self.lock = threading.Lock()
        self.slow_seconds = slow_seconds
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                with outer.lock:
                    outer.calls.append(body)
                status, answer = outer.answer(body)
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/authorize"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, body):
        action = body.get("action")
        ext = body.get("ext") or {}
        if action == "handshake":
            if ext.get("password") == "wrong":
                return 200, {"allow": False, "error": "Wrong password"}
            return 200, {"allow": True, "user": ext.get("user", "anon")}
        channel = body.get("channel", "")
        first = channel.split("/")[1] if channel.count("/") >= 1 else ""
        if action == "publish":
            return 200, {"allow": first == "allow"}
        if first == "allow":
            return 200, {"allow": True}
        if first == "deny":
            return 200, {"allow": False, "error": "Not your job"}
        if first == "slow":
            time.sleep(self.slow_seconds)
            return 200, {"allow": True}
        if first == "fail":
            return 500, {"error": "boom"}
        if first == "garbage":
            return 200, b"<html>not json</html>"
        if first == "jobs":
            owner = channel.split("/")[2] if channel.count("/") >= 2 else None
            return 200, ({"allow": True} if owner and owner == body.get("user")
                         else {"allow": False, "error": "Not your job"})
        return 200, {"allow": False}

    def questions(self, action=None):
        with self.lock:
            return [c for c in self.calls if action is None or c.get("action") == action]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        return False


def closed_port_url():
    return f"http://127.0.0.1:{closed_port()}/authorize"
