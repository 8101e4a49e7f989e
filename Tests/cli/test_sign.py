"""`pubsub sign`: PrivatePub's subscribe_to JSON, verified by the broker."""

import json

import pytest

from clitools import SECRET, Broker, clean_env, hmac_sign, now_ms, run
from pubsubtest.bayeux import handshake, subscribe

pytestmark = pytest.mark.timeout(60)


def test_known_vector_exact_output():
    p = run(["sign", "--secret", "token", "--server", "http://localhost:9292/faye", "--timestamp", "123", "channel"])
    assert p.returncode == 0, p.stderr
    assert p.stdout == ('{"server":"http://localhost:9292/faye","timestamp":123,"channel":"channel",'
                        '"signature":"3cfb97087e7c99545a9e5d62393ce90e888e48fb"}\n')
    p = run(["sign", "--secret", "secret", "--timestamp", "1700000000000", "/messages/new"])
    assert p.stdout == ('{"server":"http://127.0.0.1:9292/faye","timestamp":1700000000000,"channel":"/messages/new",'
                        '"signature":"e6541e9adc999c15f7cbae4fa5dd05e07390551a"}\n')


def test_environment_and_hmac_form():
    env = clean_env(PUBSUB_SECRET="token", PUBSUB_URL="http://push.example.com/faye")
    p = run(["sign", "--hmac", "--timestamp", "123", "--client-id", "abc", "/chat/*"], env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"server": "http://push.example.com/faye", "timestamp": 123, "channel": "/chat/*",
                                    "signature": hmac_sign("/chat/*", 123, "abc", "token"), "clientId": "abc"}


def test_errors():
    p = run(["sign", "/a"])
    assert p.returncode == 64 and "no secret" in p.stderr
    p = run(["sign", "--secret", "s", "--client-id", "x", "/a"])
    assert p.returncode == 64


def subscribe_with(b, cid, signed, keys=("private_pub_signature", "private_pub_timestamp")):
    """Subscribes to the channel `signed` (`pubsub sign`'s output) names, with its signature and timestamp in ext
    under `keys`; returns the reply unasserted."""
    ext = {keys[0]: signed["signature"], keys[1]: signed["timestamp"]}
    return subscribe(b, cid, signed["channel"], id="s", ext=ext, check=False)


def test_signature_verifies_on_the_broker():
    with Broker(timeout=45, secret=SECRET, signature_expiration=60) as b:
        cid = handshake(b)
        for channel in ["/signed/a", "/signed/*", "/signed/**"]:
            p = run(["sign", "--secret", SECRET, "--server", b.url, channel])
            signed = json.loads(p.stdout)
            assert signed["server"] == b.url and abs(signed["timestamp"] - now_ms()) < 10_000
            assert subscribe_with(b, cid, signed)["successful"] is True
        # A signature for one channel does not open another, nor the wildcard above it.
        signed = json.loads(run(["sign", "--secret", SECRET, "/signed/a"]).stdout)
        for other in ["/signed/b", "/signed/*"]:
            reply = subscribe_with(b, cid, dict(signed, channel=other))
            assert reply["successful"] is False and reply["error"] == "Incorrect signature."
        # Signed with another secret, or too long ago.
        signed = json.loads(run(["sign", "--secret", "other", "/signed/a"]).stdout)
        assert subscribe_with(b, cid, signed)["error"] == "Incorrect signature."
        old = now_ms() - 120_000
        signed = json.loads(run(["sign", "--secret", SECRET, "--timestamp", str(old), "/signed/a"]).stdout)
        assert subscribe_with(b, cid, signed)["error"] == "Signature has expired."


def test_hmac_signature_verifies_on_the_broker():
    with Broker(timeout=45, secret=SECRET, extra_args=["--signatures", "both"]) as b:
        cid = handshake(b)
        hmac_keys = ("signature", "timestamp")
        bound = json.loads(run(["sign", "--hmac", "--secret", SECRET, "--client-id", cid, "/h/a"]).stdout)
        assert subscribe_with(b, cid, bound, hmac_keys)["successful"] is True
        unbound = json.loads(run(["sign", "--hmac", "--secret", SECRET, "/h/b"]).stdout)
        assert subscribe_with(b, cid, unbound, hmac_keys)["successful"] is True
        other = handshake(b)
        reply = subscribe_with(b, other, bound, hmac_keys)
        assert reply["successful"] is False and reply["error"] == "Incorrect signature."
        # "both" still takes PrivatePub's SHA-1 signatures.
        sha1 = json.loads(run(["sign", "--secret", SECRET, "/h/c"]).stdout)
        assert subscribe_with(b, cid, sha1)["successful"] is True
