"""JWT keys from a JWKS URL (`--jwt-jwks-url`) against the real broker and a real JWKS server on loopback: keys made
by `cryptography`, tokens by PyJWT. Rotation mid-run, the unknown-kid refetch and its rate limit (counted at the
JWKS server), a provider down or answering garbage (last keys kept, counted on /metrics), never any good keys
(fail closed), JWKS beside --jwt-key, and bad flags."""

import base64
import json
import re
import subprocess
import threading
import time
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from authkit import (HS_SECRET, Broker, Listener, assert_nothing_delivered, claims, client_id, connect, handshake,
                     hs256, hs256_with_public_key_as_secret, publish, pubsub_bin, subscribe)
from pubsubtest.ports import closed_port
from pubsubtest.wait import wait_until


def b64url_uint(n, length=None):
    data = n.to_bytes(length or (n.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class SigningKey:
    """A provider's signing key (RSA for RS256 or P-256 for ES256), its public JWK, and the tokens it signs."""

    def __init__(self, kid, kind="rsa"):
        self.kid = kid
        self.kind = kind
        if kind == "rsa":
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())

    @property
    def alg(self):
        return "RS256" if self.kind == "rsa" else "ES256"

    def jwk(self):
        numbers = self.private.public_key().public_numbers()
        if self.kind == "rsa":
            return {"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256",
                    "n": b64url_uint(numbers.n), "e": b64url_uint(numbers.e)}
        return {"kty": "EC", "kid": self.kid, "use": "sig", "alg": "ES256", "crv": "P-256",
                "x": b64url_uint(numbers.x, 32), "y": b64url_uint(numbers.y, 32)}

    def token(self, payload, kid=None):
        return jwt.encode(payload, self.private, algorithm=self.alg, headers={"kid": kid or self.kid})


class JWKSServer:
    """A provider's jwks_uri on loopback. `mode`: "ok" (the keys), "status" (503), "garbage" (200, not JSON),
    "empty" ({"keys": []}); `stop()` takes it down (connections refused). Counts the requests it gets."""

    def __init__(self, keys=()):
        self.lock = threading.Lock()
        self.keys = list(keys)
        self.mode = "ok"
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with outer.lock:
                    outer.requests += 1
                    mode, keys = outer.mode, list(outer.keys)
                if mode == "status":
                    status, body = 503, b'{"error": "maintenance"}'
                elif mode == "garbage":
                    status, body = 200, b"<html>Sign in to continue</html>"
                elif mode == "empty":
                    status, body = 200, b'{"keys": []}'
                else:
                    status, body = 200, json.dumps({"keys": [k.jwk() for k in keys]}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.running = False

    def set(self, keys=None, mode=None):
        with self.lock:
            if keys is not None:
                self.keys = list(keys)
            if mode is not None:
                self.mode = mode

    def count(self):
        with self.lock:
            return self.requests

    def __enter__(self):
        self.thread.start()
        self.running = True
        return self

    def stop(self):
        if self.running:
            self.running = False
            self.server.shutdown()
            self.server.server_close()

    def __exit__(self, *exc):
        self.stop()
        return False


def jwks_broker(url, refresh=None, extra=()):
    args = ["--jwt-jwks-url", url]
    if refresh is not None:
        args += ["--jwt-jwks-refresh", str(refresh)]
    return Broker(timeout=5, extra_args=args + list(extra))


def metric(b, name, **labels):
    """The value of one sample on /metrics (0 when absent)."""
    text = requests.get(b.url.replace("/faye", "/metrics"), timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" ([0-9.e+]+)"
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def accepted(b, token):
    return handshake(b, token=token).get("successful") is True


# Polls a check (which may send a token: a due refresh is started by a token or by the refresh service) for 8 s,
# and returns its last answer for the test to assert.
eventually = partial(wait_until, timeout=8.0, interval=0.25, raises=False)


def wait_past_unknown_kid_interval(since):
    """The unknown-kid refetch happens at most every 10 s."""
    time.sleep(max(0.0, since + 11 - time.monotonic()))


@pytest.fixture(scope="module")
def key_a():
    return SigningKey("key-a")


@pytest.fixture(scope="module")
def key_b():
    return SigningKey("key-b")


def test_tokens_signed_by_the_providers_keys_grant_their_claims(key_a):
    ec_key = SigningKey("key-ec", kind="ec")
    with JWKSServer([key_a, ec_key]) as idp, jwks_broker(idp.url) as b:
        assert idp.count() == 1  # fetched at start
        listener = Listener(b, "/jobs/42", token=key_a.token(claims("42", channels=["/jobs/42"])))
        reply = publish(b, "/jobs/42", "done", ext={"token": ec_key.token(claims("svc", publish=["/jobs/**"]))})
        assert reply["successful"] is True, reply
        assert [e["data"] for e in listener.events()] == ["done"]
        # The claims are read by the same rules as with --jwt-key: a channel outside them, an expired token.
        assert subscribe(b, listener.cid, "/jobs/43")["error"] == "403:/jobs/43:No token grants this channel"
        assert handshake(b, token=key_a.token(claims("42", ttl=-5)))["error"] == "401::Token expired"
        assert eventually(lambda: "JWKS keys: RS256 key-a; ES256 key-ec" in b.log()), b.log()
        assert idp.count() == 1


def test_forged_and_confused_tokens_are_refused(key_a):
    stranger = SigningKey("key-a")  # the provider's kid, another key
    with JWKSServer([key_a]) as idp, jwks_broker(idp.url) as b:
        for token in [
            stranger.token(claims("42", channels=["/**"])),
            # The RS/HS confusion: an HS256 token whose secret is the provider's public key material.
            hs256_with_public_key_as_secret(json.dumps(key_a.jwk()).encode(), claims("admin", channels=["/**"])),
            jwt.encode(claims("admin"), None, algorithm="none", headers={"kid": "key-a"}),
            # The right key, without a kid.
            jwt.encode(claims("42"), key_a.private, algorithm="RS256"),
            # The right key and kid under another algorithm (PS256): keys are bound to RS256 or ES256.
            jwt.encode(claims("42"), key_a.private, algorithm="PS256", headers={"kid": "key-a"}),
        ]:
            reply = handshake(b, token=token)
            assert reply["successful"] is False and reply["error"] == "401::Invalid token", reply
        assert accepted(b, key_a.token(claims("42")))


def test_rotation_mid_run_without_a_restart(key_a, key_b):
    with JWKSServer([key_a]) as idp, jwks_broker(idp.url, refresh=2) as b:
        session = client_id(b, token=key_a.token(claims("42", channels=["/jobs/42"])))
        # The provider publishes the next key; a token signed with it is accepted at once (its kid is unknown:
        # the keys are fetched again), without a restart.
        idp.set(keys=[key_a, key_b])
        assert accepted(b, key_b.token(claims("42", channels=["/jobs/42"])))
        # The provider drops the old key: tokens signed with it are refused after the next refresh.
        idp.set(keys=[key_b])
        assert eventually(lambda: not accepted(b, key_a.token(claims("42")))), b.log()[-3000:]
        for _ in range(3):
            assert handshake(b, token=key_a.token(claims("42")))["error"] == "401::Invalid token"
            assert accepted(b, key_b.token(claims("42")))
        # A session made before keeps what its token granted (until its exp), as with any key.
        reply, _ = connect(b, session)
        assert reply["successful"] is True, reply
        assert b.alive()


def test_unknown_kids_are_refetched_at_most_every_ten_seconds(key_a):
    with JWKSServer([key_a]) as idp, jwks_broker(idp.url) as b:
        assert idp.count() == 1
        forger = SigningKey("forger", kind="ec")
        first = time.monotonic()
        # A flood of forged kids: one refetch, every token refused.
        errors = []

        def flood(n):
            for i in range(n):
                reply = handshake(b, token=forger.token(claims("admin", channels=["/**"]), kid=f"forged-{n}-{i}"))
                if reply.get("error") != "401::Invalid token":
                    errors.append(reply)

        threads = [threading.Thread(target=flood, args=(40,)) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert idp.count() == 2, idp.count()
        # A real new key published now is not fetched for either until the interval has passed.
        key_c = SigningKey("key-c")
        idp.set(keys=[key_a, key_c])
        assert accepted(b, key_c.token(claims("42"))) is False
        assert idp.count() == 2
        wait_past_unknown_kid_interval(first)
        assert accepted(b, key_c.token(claims("42")))
        assert idp.count() == 3
        # Known kids never refetch.
        for _ in range(20):
            assert accepted(b, key_a.token(claims("42")))
        assert idp.count() == 3


@pytest.mark.parametrize("outage", ["down", "status", "garbage", "empty"])
def test_a_provider_down_or_answering_garbage_keeps_the_last_keys(key_a, outage):
    reason = {"down": "unreachable", "status": "status", "garbage": "unreadable", "empty": "no_keys"}[outage]
    with JWKSServer([key_a]) as idp, jwks_broker(idp.url, refresh=1) as b:
        assert accepted(b, key_a.token(claims("42")))
        assert metric(b, "pubsub_jwks_keys") == 1
        if outage == "down":
            idp.stop()
        else:
            idp.set(mode=outage)
        # Refreshes fail (started by tokens or by the refresh service); the tokens are still accepted.
        assert eventually(lambda: accepted(b, key_a.token(claims("42")))
                          and metric(b, "pubsub_jwks_refresh_failures_total", reason=reason) >= 1), b.log()[-3000:]
        for _ in range(3):
            assert accepted(b, key_a.token(claims("42")))
        assert metric(b, "pubsub_jwks_keys") == 1
        # The log is read from the broker's output by another thread: it may trail the metric.
        assert eventually(lambda: "JWKS fetch failed: keeping the last 1 key(s)" in b.log()
                          and f"pubsub.jwks.failure={reason}" in b.log()), b.log()
        if outage != "down":
            # The provider recovers: its answer replaces the keys again.
            key_d = SigningKey("key-d")
            idp.set(keys=[key_d], mode="ok")
            assert eventually(lambda: not accepted(b, key_a.token(claims("42"))), timeout=15), b.log()[-3000:]
            assert accepted(b, key_d.token(claims("42")))


@pytest.mark.parametrize("provider", ["garbage", "closed"])
def test_without_any_good_keys_every_token_is_refused(key_a, provider):
    with JWKSServer([key_a]) as idp:
        idp.set(mode="garbage")
        url = idp.url if provider == "garbage" else f"http://127.0.0.1:{closed_port()}/jwks.json"
        with jwks_broker(url, extra=["--public", "/open/**"]) as b:
            token = key_a.token(claims("42", channels=["/jobs/42"], publish=["/jobs/**"]))
            # Refused with the same error any token that does not verify gets.
            reply = handshake(b, token=token)
            assert reply["successful"] is False and reply["error"] == "401::Invalid token", reply
            cid = client_id(b)  # a client without a token still handshakes (public channels)
            connect(b, cid)
            assert subscribe(b, cid, "/jobs/42", token=token)["error"] == "403:/jobs/42:Invalid token"
            assert publish(b, "/jobs/42", "x", ext={"token": token})["error"] == "403:/jobs/42:Invalid token"
            assert_nothing_delivered(b, cid)
            reason = "unreadable" if provider == "garbage" else "unreachable"
            assert metric(b, "pubsub_jwks_refresh_failures_total", reason=reason) >= 1
            assert metric(b, "pubsub_jwks_keys") == 0
            assert eventually(lambda: "no keys yet" in b.log()), b.log()
            if provider == "garbage":
                # Good keys at last: accepted without a restart.
                idp.set(mode="ok")
                assert eventually(lambda: accepted(b, token), timeout=15), b.log()[-3000:]


def test_jwks_beside_an_hmac_key(key_a):
    with JWKSServer([key_a]) as idp, jwks_broker(idp.url, extra=["--jwt-key", HS_SECRET]) as b:
        assert accepted(b, hs256(claims("42")))
        assert accepted(b, key_a.token(claims("42")))
        # An HS256 token never reaches the JWKS: no refetch for its kid.
        forged = jwt.encode(claims("42"), "another-secret-that-is-32-bytes-long!!", algorithm="HS256",
                            headers={"kid": "new"})
        assert handshake(b, token=forged)["error"] == "401::Invalid token"
        assert idp.count() == 1
        assert eventually(lambda: "JWTs (HS256, RS256, ES256)" in b.log()), b.log()


def test_audience_and_issuer_apply_to_jwks_tokens(key_a):
    with JWKSServer([key_a]) as idp, jwks_broker(idp.url, extra=["--jwt-audience", "pubsub",
                                                               "--jwt-issuer", "https://idp.example"]) as b:
        good = claims("42", aud="pubsub", iss="https://idp.example")
        assert accepted(b, key_a.token(good))
        assert handshake(b, token=key_a.token(dict(good, aud="web")))["error"] == "401::Token is for another audience"
        assert handshake(b, token=key_a.token(dict(good, iss="https://evil")))["error"] \
            == "401::Token is from another issuer"


@pytest.mark.parametrize("args,text", [
    (["--jwt-jwks-url", "ftp://idp.example/jwks"], "--jwt-jwks-url ftp://idp.example/jwks: not an http:// or https:// URL"),
    (["--jwt-jwks-url", "idp.example/jwks"], "not an http:// or https:// URL"),
    (["--jwt-jwks-url", "https://"], "not an http:// or https:// URL"),
    (["--jwt-jwks-url", "https://idp.example/jwks", "--jwt-jwks-refresh", "0"], "--jwt-jwks-refresh must be between"),
    (["--jwt-jwks-refresh", "60"], "--jwt-jwks-refresh needs --jwt-jwks-url"),
])
def test_bad_jwks_flags_are_one_line_errors(args, text):
    p = subprocess.run([pubsub_bin(), "serve", "--port", "0"] + args, capture_output=True, text=True, timeout=20)
    assert p.returncode == 64, (args, p.returncode, p.stderr)
    assert text in p.stderr.splitlines()[0], (args, p.stderr)


def test_the_url_can_come_from_the_environment(key_a):
    import os
    with JWKSServer([key_a]) as idp:
        env = dict(os.environ, PUBSUB_JWT_JWKS_URL=idp.url, PUBSUB_JWT_JWKS_REFRESH="120")
        b = Broker(timeout=5)
        old = os.environ.copy()
        os.environ.update(env)
        try:
            with b:
                assert accepted(b, key_a.token(claims("42")))
                assert eventually(lambda: "refetched every 120 s" in b.log()), b.log()
        finally:
            os.environ.clear()
            os.environ.update(old)
        bad = subprocess.run([pubsub_bin(), "serve", "--port", "0"], capture_output=True, text=True, timeout=20,
                             env=dict(os.environ, PUBSUB_JWT_JWKS_URL="nope"))
        assert bad.returncode == 64 and "--jwt-jwks-url nope" in bad.stderr.splitlines()[0], bad.stderr
