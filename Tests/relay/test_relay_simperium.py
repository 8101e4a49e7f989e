"""`pubsub relay simperium` against `relay-fake simperium`, publishing to a real pubsub broker."""

import json
import os
import random
import subprocess
import time
import urllib.request

import pytest

from pubsubtest.broker import pubsub_bin
from relaykit import (  # noqa: F401  (broker and workdir are fixtures)
    SECRET, Lines, assert_usage_error, check_at_least_once, events, start_fake, start_subscriber, wait_for_ids,
    broker, workdir)

TOKEN = "relay-token"


@pytest.fixture
def fake():
    process, port = start_fake("simperium", "--app", "app1", "--token", f"{TOKEN}=relay@example.com")
    try:
        yield port
    finally:
        process.stop()


def control(port, action, **body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/_fake/{action}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"{}")


def start_relay(port, broker, workdir, *extra, token=TOKEN):
    return Lines([pubsub_bin(), "relay", "simperium", "--app-id", "app1", "--token", token, "--bucket", "notes",
                  "--simperium-url", f"ws://127.0.0.1:{port}", "--checkpoint", os.path.join(workdir, "checkpoint"),
                  "--url", broker.url, "--secret", SECRET, *extra])


def checkpoint(workdir):
    try:
        with open(os.path.join(workdir, "checkpoint")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def test_index_and_live_changes_arrive_as_events(fake, broker, workdir):
    control(fake, "put", bucket="notes", id="old", data={"text": "before"})
    sub = start_subscriber(broker, "/changes/notes/*")
    relay = start_relay(fake, broker, workdir, "--index-page", "2")
    try:
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the indexed entity")
        relay.wait_for(lambda: checkpoint(workdir) is not None, 30, "the first checkpoint")
        control(fake, "put", bucket="notes", id="a/b c", data={"text": "x"})
        control(fake, "put", bucket="notes", id="a/b c", data={"text": "y"})
        control(fake, "delete", bucket="notes", id="old")
        sub.wait_for(lambda: len(sub.lines()) >= 4, 30, "4 events")
        time.sleep(0.3)
        got = events(sub)
        assert [(m["channel"], m["data"]["op"], m["data"]["id"]) for m in got] == [
            ("/changes/notes/old", "update", "old"),
            ("/changes/notes/a$2Fb$20c", "insert", "a/b c"),
            ("/changes/notes/a$2Fb$20c", "update", "a/b c"),
            ("/changes/notes/old", "delete", "old"),
        ]
        assert got[0]["data"]["resync"] is True
        assert "resync" not in got[1]["data"]
        assert got[0]["data"]["source"] == "simperium:app1/notes" and got[0]["data"]["collection"] == "notes"
        assert len({m["data"]["key"] for m in got}) == 4
        deadline = time.monotonic() + 10
        while checkpoint(workdir)["position"] != got[3]["data"]["seq"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert checkpoint(workdir)["position"] == got[3]["data"]["seq"]
    finally:
        relay.stop()
        sub.stop()
    assert relay.proc.returncode == 0, relay.errors()


def test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys(fake, broker, workdir):
    total = 600
    sub = start_subscriber(broker, "/changes/notes/*")
    relay = start_relay(fake, broker, workdir, "--batch-size", "20")
    try:
        relay.wait_for(lambda: checkpoint(workdir) is not None, 30, "the first sync")
        control(fake, "bulk", bucket="notes", prefix="n", count=total)
        sub.wait_for(lambda: len(sub.lines()) >= 100, 60, "100 events before the kill")
        time.sleep(random.uniform(0, 0.02))
        relay.kill9()
        killed_at = len(sub.lines())
        relay = start_relay(fake, broker, workdir, "--batch-size", "20")
        sub.wait_for(lambda: len(sub.lines()) >= 350, 60, "350 events before the second kill")
        relay.kill9()
        relay = start_relay(fake, broker, workdir, "--batch-size", "20")

        ids = [f"n{i}" for i in range(total)]
        wait_for_ids(sub, ids, 90, f"all {total} changes")
        time.sleep(0.5)
        duplicates = check_at_least_once(events(sub), ids, op="insert", ordered=False)
        print(f"killed after {killed_at} events; {duplicates} duplicates for {total} changes")
        assert control(fake, "stats")["index_requests"] == 1
    finally:
        relay.stop()
        sub.stop()


def test_a_refused_token_is_one_line_and_a_non_zero_exit(fake, broker, workdir):
    relay = start_relay(fake, broker, workdir, "--log-level", "warning", token="wrong")
    relay.proc.wait(timeout=30)
    relay.stop()
    assert relay.proc.returncode != 0
    lines = [line for line in relay.err if line.strip()]
    assert len(lines) == 1, lines
    assert "authentication refused" in lines[0] and "Token invalid" in lines[0], lines


def test_bad_arguments_are_one_line_validation_errors(fake, broker, workdir):
    for args in (["--bucket", "no/slash"], ["--heartbeat", "0"], ["--index-page", "0"]):
        cmd = [pubsub_bin(), "relay", "simperium", "--app-id", "app1", "--token", TOKEN, "--bucket", "notes",
               "--checkpoint", os.path.join(workdir, "c"), "--url", broker.url, *args]
        done = Lines(cmd)
        done.proc.wait(timeout=30)
        done.stop()
        assert done.proc.returncode == 64, (args, done.errors())
    bad = subprocess.run([pubsub_bin(), "relay", "simperium", "--app-id", "app1", "--token", TOKEN, "--bucket", "notes",
                          "--checkpoint", os.path.join(workdir, "c"), "--simperium-url", "https://api.example"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 64, bad.stderr
    assert_usage_error(bad.stderr, "'https://api.example'", "--simperium-url", "ws:// or wss://")


def test_dropped_connections_and_unanswered_heartbeats_reconnect_without_a_gap(fake, broker, workdir):
    sub = start_subscriber(broker, "/changes/notes/*")
    relay = start_relay(fake, broker, workdir, "--heartbeat", "0.3")
    try:
        relay.wait_for(lambda: checkpoint(workdir) is not None, 30, "the first sync")
        control(fake, "bulk", bucket="notes", prefix="a", count=50)
        control(fake, "drop")
        control(fake, "bulk", bucket="notes", prefix="b", count=50)
        sub.wait_for(lambda: {m["data"]["id"] for m in events(sub)} >= {f"b{i}" for i in range(50)}, 30,
                     "the changes made around the drop")
        control(fake, "heartbeats", answer=False)
        before = control(fake, "stats")["connections"]
        relay.wait_for(lambda: control(fake, "stats")["connections"] > before, 30,
                       "a reconnection after unanswered heartbeats")
        control(fake, "heartbeats", answer=True)
        control(fake, "bulk", bucket="notes", prefix="c", count=50)
        expected = {f"{p}{i}" for p in "abc" for i in range(50)}
        sub.wait_for(lambda: {m["data"]["id"] for m in events(sub)} >= expected, 30, "every change")
        assert control(fake, "stats")["index_requests"] == 1
        assert "reconnecting" in relay.errors()
    finally:
        relay.stop()
        sub.stop()
    assert relay.proc.returncode == 0, relay.errors()


def test_a_forgotten_change_version_is_a_loud_full_resync(fake, broker, workdir):
    control(fake, "put", bucket="notes", id="kept", data={})
    relay = start_relay(fake, broker, workdir)
    try:
        relay.wait_for(lambda: checkpoint(workdir) is not None, 30, "the first sync")
    finally:
        relay.stop()
    old = checkpoint(workdir)["position"]
    control(fake, "put", bucket="notes", id="while-stopped", data={})
    control(fake, "forget", bucket="notes")
    sub = start_subscriber(broker, "/changes/notes/*")
    relay = start_relay(fake, broker, workdir)
    try:
        sub.wait_for(lambda: len(sub.lines()) >= 2, 30, "the resync events")
        got = events(sub)
        assert {m["data"]["id"] for m in got} == {"kept", "while-stopped"}
        assert all(m["data"]["resync"] is True and m["data"]["op"] == "update" for m in got)
        relay.wait_for(lambda: "FULL RESYNC" in relay.errors(), 10, "the resync log line")
        assert old in relay.errors()
        relay.wait_for(lambda: checkpoint(workdir)["position"] != old, 10, "the new checkpoint")
        assert control(fake, "stats")["unknown_version_replies"] == 1
    finally:
        relay.stop()
        sub.stop()


def test_token_from_the_environment(fake, broker, workdir):
    sub = start_subscriber(broker, "/changes/notes/*")
    control(fake, "put", bucket="notes", id="env", data={})
    cmd = [pubsub_bin(), "relay", "simperium", "--app-id", "app1", "--bucket", "notes",
           "--simperium-url", f"ws://127.0.0.1:{fake}", "--checkpoint", os.path.join(workdir, "checkpoint"),
           "--url", broker.url, "--secret", SECRET]
    previous = os.environ.get("SIMPERIUM_TOKEN")
    os.environ["SIMPERIUM_TOKEN"] = TOKEN
    try:
        relay = Lines(cmd)
    finally:
        if previous is None:
            del os.environ["SIMPERIUM_TOKEN"]
        else:
            os.environ["SIMPERIUM_TOKEN"] = previous
    try:
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the indexed entity")
        assert events(sub)[0]["data"]["id"] == "env"
    finally:
        relay.stop()
        sub.stop()
    missing = Lines(cmd)
    missing.proc.wait(timeout=30)
    missing.stop()
    assert missing.proc.returncode == 64 and "SIMPERIUM_TOKEN" in missing.errors()


def test_a_simperium_feed_from_a_configuration_file(fake, broker, workdir):
    control(fake, "put", bucket="notes", id="from-file", data={"text": "x"})
    path = os.path.join(workdir, "relay.json")
    feed = {"name": "simplenote", "source": "simperium", "app_id": "app1", "token": TOKEN, "bucket": "notes",
            "simperium_url": f"ws://127.0.0.1:{fake}", "checkpoint": os.path.join(workdir, "checkpoint"),
            "include_doc": True, "heartbeat": 5, "index_page": 10}
    with open(path, "w") as f:
        json.dump({"url": broker.url, "secret": SECRET, "feeds": [feed]}, f)
    sub = start_subscriber(broker, "/changes/notes/*")
    relay = Lines([pubsub_bin(), "relay", "run", path])
    try:
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the indexed entity")
        control(fake, "put", bucket="notes", id="live", data={"text": "y"})
        sub.wait_for(lambda: len(sub.lines()) >= 2, 30, "the live change")
        got = events(sub)
        assert [(m["data"]["id"], m["data"]["op"], m["data"]["doc"]) for m in got] == [
            ("from-file", "update", {"text": "x"}), ("live", "insert", {"text": "y"})]
    finally:
        relay.stop()
        sub.stop()
    feed["index_pages"] = 3
    with open(path, "w") as f:
        json.dump({"url": broker.url, "feeds": [feed]}, f)
    check = Lines([pubsub_bin(), "relay", "run", "--check", path])
    check.proc.wait(timeout=30)
    check.stop()
    assert check.proc.returncode == 64 and "feeds[0].index_pages: unknown setting" in check.errors(), check.errors()
