"""`pubsub relay blip` against the fake Sync Gateway (`relay-fake blip`), publishing to a real pubsub broker."""

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


@pytest.fixture
def fake():
    proc, port = start_fake("blip", "--port", "0", "--frame-size", "2048", "--compress")
    yield proc, port
    proc.stop()


def control(port, path):
    with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST",
                                                       data=b""), timeout=10) as response:
        return json.loads(response.read())


def start_relay(port, broker, workdir, *extra):
    return Lines([pubsub_bin(), "relay", "blip", "--sg-url", f"ws://relay:pw@127.0.0.1:{port}/db",
                  "--checkpoint", os.path.join(workdir, "checkpoint"),
                  "--url", broker.url, "--secret", SECRET, *extra])


def test_changes_arrive_as_events(fake, broker, workdir):
    _, port = fake
    control(port, "/_fake/docs?id=n1")
    control(port, "/_fake/docs?id=n1")
    control(port, "/_fake/docs?id=a/b%20c")
    control(port, "/_fake/docs?id=gone")
    sub = start_subscriber(broker, "/changes/db/*")
    relay = start_relay(port, broker, workdir, "--include-doc")
    try:
        sub.wait_for(lambda: len(sub.lines()) >= 3, 30, "the first sync")
        control(port, "/_fake/docs?id=gone&deleted=1")
        control(port, "/_fake/docs?id=late")
        sub.wait_for(lambda: len(sub.lines()) >= 5, 30, "the live changes")
        time.sleep(0.5)
        got = events(sub)
        assert [(m["channel"], m["data"]["op"], m["data"]["id"]) for m in got] == [
            ("/changes/db/n1", "update", "n1"),
            ("/changes/db/a$2Fb$20c", "insert", "a/b c"),
            ("/changes/db/gone", "insert", "gone"),
            ("/changes/db/gone", "delete", "gone"),
            ("/changes/db/late", "insert", "late"),
        ]
        assert [m["data"]["seq"] for m in got] == ["2", "3", "4", "5", "6"]
        assert got[0]["data"]["rev"].startswith("2-")
        # --include-doc: the bodies came in rev messages.
        assert got[0]["data"]["doc"] == {"_id": "n1", "_rev": got[0]["data"]["rev"], "seq": 2}
        assert got[3]["data"]["doc"] == {"_deleted": True}
        assert got[0]["data"]["source"] == f"blip:127.0.0.1:{port}/db"
        with open(os.path.join(workdir, "checkpoint")) as f:
            checkpoint = json.load(f)
        assert checkpoint["position"] == "6"
    finally:
        relay.stop()
        sub.stop()
    assert relay.proc.returncode == 0, relay.errors()


def test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys(fake, broker, workdir):
    _, port = fake
    total = 1500
    control(port, f"/_fake/bulk?count={total}&prefix=n")
    sub = start_subscriber(broker, "/changes/db/*")
    relay = start_relay(port, broker, workdir, "--batch", "20", "--batch-size", "20")
    second = None
    try:
        sub.wait_for(lambda: len(sub.lines()) >= 200, 60, "200 events before the kill")
        relay.kill9()
        killed_at = [len(sub.lines())]
        second = start_relay(port, broker, workdir, "--batch", "20", "--batch-size", "20")
        for threshold in (600, 1000):
            sub.wait_for(lambda: len(sub.lines()) >= threshold, 60, f"{threshold} events before the next kill")
            time.sleep(random.uniform(0, 0.03))
            second.kill9()
            killed_at.append(len(sub.lines()))
            second = start_relay(port, broker, workdir, "--batch", "20", "--batch-size", "20")

        ids = [f"n{i}" for i in range(total)]
        wait_for_ids(sub, ids, 120, f"all {total} documents")
        time.sleep(0.5)
        duplicates = check_at_least_once(events(sub), ids, same=("key", "seq"))
        print(f"killed after {killed_at} events; {duplicates} duplicates for {total} changes")
    finally:
        relay.stop()
        if second is not None:
            second.stop()
        sub.stop()


def test_dropped_connection_and_forgotten_history(fake, broker, workdir):
    _, port = fake
    control(port, "/_fake/bulk?count=50&prefix=d")
    sub = start_subscriber(broker, "/changes/db/*")
    relay = start_relay(port, broker, workdir, "--batch", "10")
    try:
        sub.wait_for(lambda: len(sub.lines()) >= 50, 30, "the first 50")
        relay.stop()
        # History compacted while the relay was down: its since is refused, it resyncs loudly.
        control(port, "/_fake/forget")
        control(port, "/_fake/docs?id=late")
        relay = start_relay(port, broker, workdir, "--batch", "10")
        sub.wait_for(lambda: any(json.loads(l)["data"]["id"] == "late" for l in sub.lines()), 30, "the resync")
        assert "FULL RESYNC" in relay.errors()
        resynced = [m for m in events(sub)[50:] if m["data"].get("resync")]
        assert {m["data"]["id"] for m in resynced} >= {f"d{i}" for i in range(50)} | {"late"}
        # A dropped connection: reconnects and goes on.
        control(port, "/_fake/drop")
        control(port, "/_fake/docs?id=after-drop")
        sub.wait_for(lambda: any(json.loads(l)["data"]["id"] == "after-drop" for l in sub.lines()), 30,
                     "a change after the drop")
    finally:
        relay.stop()
        sub.stop()


def test_bad_arguments(workdir):
    base = [pubsub_bin(), "relay", "blip", "--checkpoint", os.path.join(workdir, "c"), "--url",
            "http://127.0.0.1:9/faye"]
    for args, word in ((["--sg-url", "http://host/db"], "sg-url"), (["--sg-url", "ws://h/db", "--batch", "0"], "batch"),
                       (["--sg-url", "ws://h/db", "--channel", "a,b"], "channel"),
                       (["--sg-url", "http://u:s3cret@host/db"], "sg-url"),
                       (["--sg-url", "ws://u:s3cret@host:99999/db"], "sg-url")):
        bad = subprocess.run(base + args, capture_output=True, text=True, timeout=30)
        assert bad.returncode == 64 and word in bad.stderr, bad.stderr
        assert_usage_error(bad.stderr, word)
        # A URL may carry a password: the message never shows it.
        assert "s3cret" not in bad.stderr, bad.stderr
