"""`pubsub serve` auth options: PrivatePub's YAML, public channels, clock skew, the environment."""

import subprocess
from functools import partial

import pytest

from clitools import SECRET, Broker, Listener, clean_env, closed_port, now_ms, pubsub_bin, run, sha1_sign, signed_ext
from pubsubtest.bayeux import handshake, subscribe as bayeux_subscribe
from pubsubtest.wait import wait_until

pytestmark = pytest.mark.timeout(60)

PRIVATE_PUB_YML = """# config/private_pub.yml as PrivatePub's generator writes it
development:
  server: "http://localhost:9292/faye"
  secret_token: "secret"
test:
  server: "http://localhost:9292/faye"
  secret_token: "secret"
production:
  server: "{server}"
  secret_token: "{token}"
  signature_expiration: 3600 # one hour
"""

TOKEN = "6c1e5f1a9d0b4f7e8c2a3b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081"


# Subscribes return the reply unasserted: the tests look at their errors.
subscribe = partial(bayeux_subscribe, id="s", check=False)


def test_missing_config_file_or_environment_is_one_line(tmp_path):
    config = tmp_path / "private_pub.yml"
    config.write_text(PRIVATE_PUB_YML.format(server="http://localhost:9292/faye", token=TOKEN))
    for args, message in [
        (["--environment", "staging"], f"pubsub: The staging environment does not exist in {config}"),
        ([], f"pubsub: The development environment does not exist in {config}"),
    ]:
        if not args:
            config.write_text("production:\n  secret_token: x\n")
        p = subprocess.run([pubsub_bin(), "serve", "--port", "0", "--privatepub-config", str(config)] + args,
                           capture_output=True, text=True, timeout=15, env=clean_env())
        assert p.returncode == 78, p.stderr
        assert p.stderr.strip().splitlines() == [message]
        p = run(["publish", "--privatepub-config", str(config), "/a", "1"] + args)
        assert p.returncode == 78
        assert p.stderr.strip().splitlines() == [message]
    missing = tmp_path / "nope.yml"
    p = subprocess.run([pubsub_bin(), "serve", "--port", "0", "--privatepub-config", str(missing)],
                       capture_output=True, text=True, timeout=15, env=clean_env())
    assert p.returncode == 78
    assert p.stderr.strip().splitlines() == [f"pubsub: cannot read {missing}: No such file or directory"]


def test_serve_reads_private_pub_yml(tmp_path):
    config = tmp_path / "private_pub.yml"
    # The server line only matters to clients (publish/sign); serve takes the token and the expiration.
    config.write_text(PRIVATE_PUB_YML.format(server="http://127.0.0.1:1/faye", token=TOKEN))
    with Broker(timeout=45, extra_args=["--privatepub-config", str(config), "--environment", "production"]) as b:
        assert "PrivatePub's configuration names the server http://127.0.0.1:1/faye" in b.log()
        assert "valid for 3600 s" in b.log()
        cid = handshake(b)
        assert subscribe(b, cid, "/pp/a", ext=signed_ext("/pp/a", TOKEN))["successful"] is True
        assert subscribe(b, cid, "/pp/b", ext=signed_ext("/pp/b", "secret"))["error"] == "Incorrect signature."
        old = now_ms() - 3601_000
        expired = subscribe(b, cid, "/pp/c", ext=signed_ext("/pp/c", TOKEN, ts=old))
        assert expired["error"] == "Signature has expired."
        # publish with the same file, pointed at this broker by --url (a flag wins over the file).
        with Listener(b) as l:
            assert l.subscribe("/pp/a", signed_ext("/pp/a", TOKEN))["successful"] is True
            p = run(["publish", "--privatepub-config", str(config), "--environment", "production",
                     "--url", b.url, "/pp/a", '{"from":"yml"}'])
            assert p.returncode == 0, p.stderr
            assert [e["data"] for e in l.wait_events(1)] == [{"from": "yml"}]
            # Without --url the file's server is used: nothing listens there.
            p = run(["publish", "--privatepub-config", str(config), "--environment", "production", "/pp/a", "1"])
            assert p.returncode == 69 and "127.0.0.1:1" in p.stderr
            # RAILS_ENV picks the section, as private_pub.ru does.
            p = run(["publish", "--privatepub-config", str(config), "--url", b.url, "/pp/a", "2"],
                    env=clean_env(RAILS_ENV="production"))
            assert p.returncode == 0, p.stderr
            p = run(["publish", "--privatepub-config", str(config), "--url", b.url, "/pp/a", "3"])
            assert p.returncode == 1 and "Incorrect token." in p.stderr  # development's token is "secret"
            assert [e["data"] for e in l.wait_events(2)] == [{"from": "yml"}, 2]
            l.assert_quiet(count=2)


def test_public_channels():
    with Broker(timeout=45, secret=SECRET, extra_args=["--public", "/news/**", "--public", "/status"]) as b:
        # Logged just after the port opens: the log reader may see it a moment later on a busy machine.
        wait_until(lambda: "except on public /news/**, /status" in b.log(), 10, message="the public channels logged")
        cid = handshake(b)
        for channel in ["/news/today", "/news/*", "/news/a/**", "/status"]:
            assert subscribe(b, cid, channel)["successful"] is True, channel
        for channel in ["/news", "/statuses", "/**", "/private"]:
            reply = subscribe(b, cid, channel)
            assert reply["successful"] is False and reply["error"] == "Incorrect signature.", channel
        # Public channels still need the token to publish.
        p = run(["publish", "--url", b.url, "/news/today", "1"])
        assert p.returncode == 1 and "Incorrect token." in p.stderr
        with Listener(b) as l:
            assert l.subscribe("/news/*")["successful"] is True
            assert run(["publish", "--url", b.url, "--secret", SECRET, "/news/today", "2"]).returncode == 0
            assert [e["data"] for e in l.wait_events(1)] == [2]


def test_max_clock_skew():
    with Broker(timeout=45, secret=SECRET, extra_args=["--max-clock-skew", "10"]) as b:
        cid = handshake(b)
        soon = now_ms() + 5_000
        assert subscribe(b, cid, "/skew/a", ext=signed_ext("/skew/a", ts=soon))["successful"] is True
        later = now_ms() + 60_000
        reply = subscribe(b, cid, "/skew/b", ext=signed_ext("/skew/b", ts=later))
        assert reply["error"] == "Signature timestamp is in the future."


def test_secret_from_environment():
    b = Broker(timeout=45)
    env_before = dict(__import__("os").environ)
    __import__("os").environ["PUBSUB_SECRET"] = "from-env"
    try:
        b.start()
    finally:
        __import__("os").environ.clear()
        __import__("os").environ.update(env_before)
    try:
        cid = handshake(b)
        assert subscribe(b, cid, "/env/a", ext=signed_ext("/env/a", "from-env"))["successful"] is True
        assert subscribe(b, cid, "/env/b")["error"] == "Incorrect signature."
        assert "no secret set" not in b.log()
    finally:
        b.stop()


def test_open_broker_says_so_once():
    with Broker(timeout=45) as b:
        cid = handshake(b)
        assert subscribe(b, cid, "/open/a")["successful"] is True
        assert b.log().count("no secret set") == 1


@pytest.mark.parametrize("args,text", [
    (["--public", "/news/**"], "needs an authorization mode"),
    (["--secret", "s", "--signatures", "md5"], "'privatepub', 'hmac' or 'both'"),
    (["--secret", "s", "--public", "/meta/**"], "--public /meta/**"),
    (["--secret", "s", "--max-clock-skew", "-1"], "--max-clock-skew"),
])
def test_serve_rejects_bad_auth_options(args, text):
    p = subprocess.run([pubsub_bin(), "serve", "--port", str(closed_port())] + args,
                       capture_output=True, text=True, timeout=15, env=clean_env())
    assert p.returncode != 0
    assert text in p.stderr
