"""JWT against the real broker: tokens made by PyJWT (HS256, RS256, ES256) and the attacks on them. Every refusal
checks that nothing was delivered."""

import time

import pytest

from pubsubtest.process import Lines

from authkit import (Broker, HS_SECRET, Keys, Listener, alg_none, assert_nothing_delivered, bayeux, claims,
                     client_id, connect, es256, handshake, hs256, hs256_with_public_key_as_secret, publish, rs256,
                     subscribe)


@pytest.fixture(scope="module")
def keys():
    return Keys()


@pytest.fixture(scope="module")
def hs_broker():
    with Broker(timeout=5, extra_args=["--jwt-key", HS_SECRET]) as b:
        yield b


def back_end_publish(b, channel, data, secret=HS_SECRET):
    """What an app's back end does: publish with a token whose `publish` claim covers the channel."""
    reply = publish(b, channel, data, ext={"token": hs256(claims("backend", publish=[channel]), secret)})
    assert reply["successful"] is True, reply


def test_hs256_connection_token_grants_its_channels_and_names_the_user(hs_broker):
    b = hs_broker
    token = hs256(claims("42", channels=["/jobs/42", "/users/42/**"]))
    listener = Listener(b, "/jobs/42", token=token)
    assert subscribe(b, listener.cid, "/users/42/inbox")["successful"] is True
    back_end_publish(b, "/jobs/42", {"done": 1})
    back_end_publish(b, "/users/42/inbox", {"hi": 1})
    got = listener.events()
    assert [e["data"] for e in got] == [{"done": 1}, {"hi": 1}]
    assert "token" not in (got[0].get("ext") or {})  # the publisher's token is not delivered


@pytest.mark.parametrize("channel", ["/jobs/43", "/jobs/*", "/users/43/inbox", "/users/**"])
def test_a_channel_outside_the_claims_is_refused_and_gets_nothing(hs_broker, channel):
    b = hs_broker
    cid = client_id(b, token=hs256(claims("42", channels=["/jobs/42", "/users/42/**"])))
    connect(b, cid)
    reply = subscribe(b, cid, channel)
    assert reply["successful"] is False
    assert reply["error"] == f"403:{channel}:No token grants this channel"
    back_end_publish(b, "/jobs/43", 1)
    back_end_publish(b, "/users/43/inbox", 1)
    assert_nothing_delivered(b, cid)


@pytest.mark.parametrize("maker,file_attr", [(rs256, "rsa_file"), (es256, "ec_file")])
def test_rs256_and_es256_with_a_public_key(keys, maker, file_attr):
    with Broker(timeout=5, extra_args=["--jwt-public-key", getattr(keys, file_attr)]) as b:
        listener = Listener(b, "/jobs/7", token=maker(keys, claims("7", channels=["/jobs/7"])))
        reply = publish(b, "/jobs/7", "hello", ext={"token": maker(keys, claims("svc", publish=["/jobs/**"]))})
        assert reply["successful"] is True, reply
        assert [e["data"] for e in listener.events()] == ["hello"]
        # An HS256 token is refused: this broker has no HMAC key.
        assert handshake(b, token=hs256(claims("7")))["error"] == "401::Invalid token"


def test_rs256_key_never_verifies_an_hs256_token_made_with_the_public_key(keys):
    with Broker(timeout=5, extra_args=["--jwt-public-key", keys.rsa_file]) as b:
        forged = hs256_with_public_key_as_secret(keys.rsa_public_pem, claims("admin", channels=["/**"]))
        reply = handshake(b, token=forged)
        assert reply["successful"] is False and reply["error"] == "401::Invalid token", reply
        assert "clientId" not in reply
        # Nor as a publish token.
        listener = Listener(b, "/secret", token=rs256(keys, claims("1", channels=["/secret"])))
        forged_publish = hs256_with_public_key_as_secret(keys.rsa_public_pem, claims("admin", publish=["/**"]))
        assert publish(b, "/secret", "x", ext={"token": forged_publish})["error"] == "403:/secret:Invalid token"
        assert listener.events() == []


@pytest.mark.parametrize("case", ["alg_none", "expired", "not_yet_valid", "wrong_secret", "no_sub", "garbage"])
def test_bad_connection_tokens_refuse_the_handshake(hs_broker, case):
    b = hs_broker
    token, error = {
        "alg_none": (alg_none(claims("42", channels=["/**"])), "401::Invalid token"),
        "expired": (hs256(claims("42", ttl=-10)), "401::Token expired"),
        "not_yet_valid": (hs256(claims("42", nbf=int(time.time()) + 600)), "401::Token not yet valid"),
        "wrong_secret": (hs256(claims("42"), "another-secret-another-secret-0123456789"), "401::Invalid token"),
        "no_sub": (hs256({"exp": int(time.time()) + 60, "channels": ["/**"]}), "401::Token has no subject"),
        "garbage": ("not-a-jwt", "401::Invalid token"),
    }[case]
    reply = handshake(b, token=token)
    assert reply["successful"] is False, reply
    assert reply["error"] == error
    assert reply["advice"]["reconnect"] == "handshake"
    assert "clientId" not in reply


def test_subscription_tokens(hs_broker):
    b = hs_broker
    cid = client_id(b, token=hs256(claims("42")))  # a connection token that grants no channel
    connect(b, cid)
    # Its own subscription token, for this user and this channel.
    assert subscribe(b, cid, "/jobs/9", token=hs256(claims("42", channel="/jobs/9")))["successful"] is True
    # Another user's subscription token.
    reply = subscribe(b, cid, "/jobs/10", token=hs256(claims("43", channel="/jobs/10")))
    assert reply["error"] == "403:/jobs/10:Token is for another user"
    # A token for another channel.
    reply = subscribe(b, cid, "/jobs/11", token=hs256(claims("42", channel="/jobs/12")))
    assert reply["error"] == "403:/jobs/11:Token is for another channel"
    # Expired, alg none.
    assert subscribe(b, cid, "/jobs/13", token=hs256(claims("42", ttl=-1, channel="/jobs/13")))["error"] \
        == "403:/jobs/13:Token expired"
    assert subscribe(b, cid, "/jobs/14", token=alg_none(claims("42", channel="/jobs/14")))["error"] \
        == "403:/jobs/14:Invalid token"
    for channel in ["/jobs/10", "/jobs/11", "/jobs/12", "/jobs/13", "/jobs/14"]:
        back_end_publish(b, channel, channel)
    back_end_publish(b, "/jobs/9", "mine")
    reply, events = connect(b, cid, advice_timeout=500)
    assert [e["data"] for e in events] == ["mine"]


def test_an_anonymous_session_gets_nothing_without_tokens(hs_broker):
    b = hs_broker
    cid = client_id(b)  # no token: the handshake is not refused, but nothing is granted
    connect(b, cid)
    assert subscribe(b, cid, "/jobs/1")["error"] == "403:/jobs/1:No token grants this channel"
    assert publish(b, "/jobs/1", 1, cid=cid)["error"] == "403:/jobs/1:No token grants this channel"
    back_end_publish(b, "/jobs/1", 1)
    assert_nothing_delivered(b, cid)


def test_publish_claims(hs_broker):
    b = hs_broker
    listener = Listener(b, "/chat/**", token=hs256(claims("1", channels=["/chat/**"])))
    cid = client_id(b, token=hs256(claims("2", publish=["/chat/room1"])))
    connect(b, cid)
    assert publish(b, "/chat/room1", "ok", cid=cid)["successful"] is True
    assert publish(b, "/chat/room2", "no", cid=cid)["error"] == "403:/chat/room2:No token grants this channel"
    assert publish(b, "/chat/room2", "no", ext={"token": alg_none(claims("x", publish=["/**"]))})["error"] \
        == "403:/chat/room2:Invalid token"
    assert [e["data"] for e in listener.events()] == ["ok"]


def test_expiry_mid_session_answers_connect_401_with_advice_handshake(hs_broker):
    b = hs_broker
    cid = client_id(b, token=hs256(claims("42", ttl=2, channels=["/jobs/42"])))
    connect(b, cid)
    assert subscribe(b, cid, "/jobs/42")["successful"] is True
    time.sleep(2.5)
    reply, events = connect(b, cid)
    assert reply["successful"] is False
    assert reply["error"] == f"401:{cid}:Token expired"
    assert reply["advice"]["reconnect"] == "handshake"
    # The session is gone: it is not resumed with a connect, and publishes reach no one.
    reply, _ = connect(b, cid)
    assert reply["error"] == f"401:{cid}:Unknown client"


def test_bad_flags_are_one_line_errors(keys, tmp_path):
    import subprocess
    from authkit import pubsub_bin
    not_pem = tmp_path / "key.txt"
    not_pem.write_text("hello")
    bad_pem = tmp_path / "bad.pem"
    bad_pem.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    for args, text in [
        (["--jwt-key", "short"], "--jwt-key must be at least 32 bytes"),
        (["--jwt-public-key", str(tmp_path / "missing.pem")], "cannot read the file"),
        (["--jwt-public-key", str(not_pem)], "not a PEM file"),
        (["--jwt-public-key", str(bad_pem)], "not a PEM RSA or P-256 EC public key"),
        (["--auth-hook", "ftp://x"], "not an http:// or https:// URL"),
        (["--auth-hook", "http://127.0.0.1:1/a", "--auth-hook-actions", "subscribe,watch"], "watch is not"),
        (["--auth-hook", "http://127.0.0.1:1/a", "--auth-hook-timeout", "0"], "--auth-hook-timeout"),
        (["--auth-hook-timeout", "3"], "need --auth-hook"),
        (["--allowed-origins", "example.com"], "--allowed-origins example.com: not an origin"),
    ]:
        p = subprocess.run([pubsub_bin(), "serve", "--port", "0"] + args, capture_output=True, text=True,
                           timeout=20)
        assert p.returncode != 0, (args, p.stderr)
        assert text in p.stderr, (args, p.stderr)
        assert "Usage" not in p.stderr.splitlines()[0]


def test_pubsub_publish_and_subscribe_take_a_token(hs_broker):
    import subprocess
    from authkit import pubsub_bin
    b = hs_broker
    sub = Lines([pubsub_bin(), "subscribe", "--url", b.url, "--count", "1", "--timeout", "20",
                 "--token", hs256(claims("42", channels=["/cli/42"])), "/cli/42"])
    try:
        sub.wait_for(lambda: "subscribed to" in sub.errors(), 20, "the subscriber's handshake and subscribe")
        refused = subprocess.run([pubsub_bin(), "publish", "--url", b.url, "--token",
                                  hs256(claims("app", publish=["/other"])), "/cli/42", '"no"'],
                                 capture_output=True, text=True, timeout=20)
        assert refused.returncode != 0 and "No token grants this channel" in refused.stderr, refused.stderr
        ok = subprocess.run([pubsub_bin(), "publish", "--url", b.url, "--token",
                             hs256(claims("app", publish=["/cli/**"])), "/cli/42", '"yes"'],
                            capture_output=True, text=True, timeout=20)
        assert ok.returncode == 0, ok.stderr
        assert sub.proc.wait(timeout=20) == 0, sub.errors()
        for t in sub.threads:
            t.join(timeout=5)
        assert sub.lines() == ['"yes"']
    finally:
        sub.kill9()


def test_audience_and_issuer_when_configured():
    with Broker(timeout=5, extra_args=["--jwt-key", HS_SECRET, "--jwt-audience", "pubsub",
                                       "--jwt-issuer", "https://app.example.com"]) as b:
        good = claims("42", channels=["/a"], aud="pubsub", iss="https://app.example.com")
        assert handshake(b, token=hs256(good))["successful"] is True
        assert handshake(b, token=hs256(dict(good, aud=["web", "pubsub"])))["successful"] is True
        assert handshake(b, token=hs256(dict(good, aud="web")))["error"] == "401::Token is for another audience"
        assert handshake(b, token=hs256({k: v for k, v in good.items() if k != "iss"}))["error"] \
            == "401::Token is from another issuer"
