"""`pubsub channels | presence | info | disconnect` against a real broker with the server API."""

import json
import os
import subprocess

from apikit import APIBroker, api_broker, api_handshake, api_subscribe, bayeux
from pubsubtest.broker import pubsub_bin
from pubsubtest.process import Lines


def cli(*args, env=None, timeout=20):
    e = dict(os.environ)
    e.pop("PUBSUB_API_KEY", None)
    e.pop("PUBSUB_URL", None)
    e.update(env or {})
    return subprocess.run([pubsub_bin(), *args], capture_output=True, text=True, timeout=timeout, env=e)


def test_channels_presence_info_disconnect(api_broker):
    b = api_broker
    a, c = api_handshake(b), api_handshake(b)
    api_subscribe(b, a, "/room", "/jobs/1")
    api_subscribe(b, c, "/room")
    common = ["--url", b.url, "--api-key", b.key]
    p = cli("channels", *common)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0].split() == ["SUBSCRIBERS", "CHANNEL"]
    assert lines[1].split() == ["2", "/room"] and lines[2].split() == ["1", "/jobs/1"]
    p = cli("channels", "--pattern", "/jobs/**", "--json", env={"PUBSUB_URL": b.url, "PUBSUB_API_KEY": b.key})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"channels": [{"channel": "/jobs/1", "subscribers": 1}]}
    p = cli("presence", "/room", *common)
    assert p.returncode == 0, p.stderr
    assert {l.split()[0] for l in p.stdout.strip().splitlines()[1:]} == {a, c}
    assert "long-polling" in p.stdout
    p = cli("info", *common)
    assert p.returncode == 0, p.stderr
    assert "total clients: 2" in p.stdout and "long-polling=2" in p.stdout
    p = cli("disconnect", a, *common)
    assert p.returncode == 0 and p.stdout.strip() == f"disconnected {a}"
    p = cli("disconnect", a, *common)
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "no such client" in p.stderr
    p = cli("presence", "/room", "--json", *common)
    assert [x["clientId"] for x in json.loads(p.stdout)["clients"]] == [c]


def test_environment_and_errors(api_broker):
    b = api_broker
    p = cli("info", env={"PUBSUB_URL": b.url, "PUBSUB_API_KEY": b.key})
    assert p.returncode == 0 and "total clients: 0" in p.stdout
    p = cli("info", "--url", b.url)
    assert p.returncode == 64 and len(p.stderr.strip().splitlines()) == 1 and "API key" in p.stderr
    p = cli("info", "--url", b.url, "--api-key", "wrong-key-wrong-key")
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and "401" in p.stderr
    assert b.key not in p.stderr
    p = cli("presence", "no-slash", "--url", b.url, "--api-key", b.key)
    assert p.returncode == 64
    p = cli("info", "--url", "http://127.0.0.1:1/faye", "--api-key", b.key)
    assert p.returncode == 69


def test_watch_refreshes_the_table(api_broker):
    b = api_broker
    proc = Lines([pubsub_bin(), "info", "--watch", "--every", "0.3", "--url", b.url, "--api-key", b.key])
    try:
        proc.wait_for(lambda: sum("total clients: 0" in line for line in proc.lines()) >= 2, 15, "two frames")
        api_handshake(b)
        proc.wait_for(lambda: sum("total clients: 1" in line for line in proc.lines()) >= 2, 15,
                      "two frames after a handshake")
    finally:
        proc.stop()
    frames = "\n".join(proc.lines()).split("\x1b[H\x1b[2J")[1:]
    assert len(frames) >= 4
    assert "total clients: 0" in frames[0] and "total clients: 1" in frames[-1]
