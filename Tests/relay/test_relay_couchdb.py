"""`pubsub relay couchdb` against the fake `_changes` server (`relay-fake couchdb`), publishing to a real broker."""

import json
import os
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

from pubsubtest.broker import pubsub_bin
from relaykit import (  # noqa: F401  (broker and workdir are fixtures)
    SECRET, Lines, assert_usage_error, check_at_least_once, events, start_fake, start_subscriber, wait_for_ids,
    broker, workdir)


def call(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def put(port, doc_id, body, rev=None):
    if rev is not None:
        body = dict(body, _rev=rev)
    answer = call(port, "PUT", "/db/" + urllib.parse.quote(doc_id, safe=""), body)
    assert answer["ok"] and answer["id"] == doc_id
    return answer["rev"]


def delete(port, doc_id, rev):
    return call(port, "DELETE", "/db/" + urllib.parse.quote(doc_id, safe="") + "?rev=" + rev)["rev"]


def start_relay(port, broker, workdir, *extra):
    return Lines([pubsub_bin(), "relay", "couchdb", "--db-url", f"http://127.0.0.1:{port}/db",
                  "--checkpoint", os.path.join(workdir, "checkpoint"), "--url", broker.url, "--secret", SECRET,
                  "--heartbeat", "500", *extra])


@pytest.mark.parametrize("flavour,feed", [("opaque", "continuous"), ("integer", "longpoll"),
                                          ("opaque", "eventsource"), ("sync-gateway", "continuous")])
def test_changes_arrive_as_events(broker, workdir, flavour, feed):
    fake, port = start_fake("couchdb", "--flavour", flavour)
    sub = start_subscriber(broker, "/changes/db/*")
    relay = start_relay(port, broker, workdir, "--feed", feed, "--include-doc")
    try:
        rev = put(port, "n1", {"body": "hello"})
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the insert")
        rev = put(port, "n1", {"body": "hello!"}, rev)
        sub.wait_for(lambda: len(sub.lines()) >= 2, 30, "the update")
        put(port, "a/b c", {"body": "x"})
        sub.wait_for(lambda: len(sub.lines()) >= 3, 30, "the second insert")
        delete(port, "n1", rev)
        sub.wait_for(lambda: len(sub.lines()) >= 4, 30, "the delete")
        time.sleep(0.3)
        got = events(sub)
        assert [(m["channel"], m["data"]["op"], m["data"]["id"]) for m in got] == [
            ("/changes/db/n1", "insert", "n1"),
            ("/changes/db/n1", "update", "n1"),
            ("/changes/db/a$2Fb$20c", "insert", "a/b c"),
            ("/changes/db/n1", "delete", "n1"),
        ]
        first, update = got[0]["data"], got[1]["data"]
        assert first["doc"]["body"] == "hello" and first["rev"].startswith("1-")
        assert update["doc"]["body"] == "hello!" and update["rev"] == rev
        assert first["source"] == f"couchdb:127.0.0.1:{port}/db" and first["collection"] == "db"
        assert len({m["data"]["key"] for m in got}) == 4
        # The checkpoint is the server's seq as it goes back in since= (a string seq without JSON quotes).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(os.path.join(workdir, "checkpoint")) as f:
                checkpoint = json.load(f)
            if checkpoint["position"] == got[-1]["data"]["seq"]:
                break
            time.sleep(0.1)
        assert checkpoint == {"source": f"couchdb:127.0.0.1:{port}/db", "position": got[-1]["data"]["seq"]}
        assert not checkpoint["position"].startswith('"') and checkpoint["position"] not in ("", "0")
    finally:
        relay.stop()
        sub.stop()
        fake.stop()
    assert relay.proc.returncode == 0, relay.errors()


def test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys(broker, workdir):
    total = 300
    fake, port = start_fake("couchdb", "--flavour", "opaque")
    sub = start_subscriber(broker, "/changes/db/*")
    relay = start_relay(port, broker, workdir, "--batch-size", "10", "--max-batch", "20")
    second = None
    writer_error = []
    try:
        def write():
            try:
                for i in range(total):
                    put(port, f"n{i}", {"i": i})
                    if i % 20 == 0:
                        time.sleep(0.02)
            except Exception as e:  # reported by the main thread
                writer_error.append(e)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        sub.wait_for(lambda: len(sub.lines()) >= 60, 60, "60 events before the kill")
        relay.kill9()
        killed_at = [len(sub.lines())]
        second = start_relay(port, broker, workdir, "--batch-size", "10", "--max-batch", "20")
        sub.wait_for(lambda: len(sub.lines()) >= 150, 60, "150 events before the second kill")
        second.kill9()
        killed_at.append(len(sub.lines()))
        writer.join(timeout=120)
        assert not writer.is_alive() and not writer_error, writer_error
        second = start_relay(port, broker, workdir, "--batch-size", "10", "--max-batch", "20")

        ids = [f"n{i}" for i in range(total)]
        wait_for_ids(sub, ids, 120, f"all {total} documents")
        time.sleep(0.5)
        duplicates = check_at_least_once(events(sub), ids, op="insert")
        print(f"killed after {killed_at} events; {duplicates} duplicates for {total} changes")
    finally:
        relay.stop()
        if second is not None:
            second.stop()
        sub.stop()
        fake.stop()


def test_unknown_since_resyncs_loudly(broker, workdir):
    fake, port = start_fake("couchdb", "--flavour", "opaque")
    sub = start_subscriber(broker, "/changes/db/*")
    relay = start_relay(port, broker, workdir)
    try:
        put(port, "a", {})
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the first change")
        time.sleep(0.5)
        relay.stop()
        put(port, "b", {})
        call(port, "POST", "/_fake/forget", {})
        relay = start_relay(port, broker, workdir)
        sub.wait_for(lambda: len(sub.lines()) >= 3, 30, "the resync")
        resynced = events(sub)[1:]
        assert sorted(m["data"]["id"] for m in resynced) == ["a", "b"]
        assert all(m["data"]["resync"] is True for m in resynced)
        relay.wait_for(lambda: "FULL RESYNC" in relay.errors(), 10, "the resync log line")
    finally:
        relay.stop()
        sub.stop()
        fake.stop()


def test_bad_arguments_and_unreachable_database(workdir):
    base = [pubsub_bin(), "relay", "couchdb", "--checkpoint", os.path.join(workdir, "c"), "--url",
            "http://127.0.0.1:9/faye"]
    # A URL may carry a password: the message names the option and never shows the password.
    for url in ["ftp://host/db", "http://host", "http://host:99999/db", "ftp://u:s3cret@host/db",
                "http://u:s3cret@host", "http://u:s3cret@host:99999/db"]:
        bad = subprocess.run(base + ["--db-url", url], capture_output=True, text=True, timeout=30)
        assert bad.returncode == 64 and "--db-url" in bad.stderr, bad.stderr
        assert_usage_error(bad.stderr, "--db-url")
        assert "s3cret" not in bad.stderr, bad.stderr
    # A feed the relay does not follow: the parser names the value and the choices, on the message's one line.
    bad = subprocess.run(base + ["--db-url", "http://127.0.0.1/db", "--feed", "normal"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 64, bad.stderr
    assert_usage_error(bad.stderr, "'normal'", "--feed", "continuous", "longpoll", "eventsource")
    # The log level, from the flag or from its variable, is one of the levels.
    for args, env in ((["--log-level", "loud"], {}), ([], {"PUBSUB_LOG_LEVEL": "loud"})):
        bad = subprocess.run(base + ["--db-url", "http://127.0.0.1/db", *args], capture_output=True, text=True,
                             timeout=30, env={**os.environ, **env})
        assert bad.returncode == 64 and "critical" in bad.stderr, bad.stderr
        assert_usage_error(bad.stderr, "'loud'")
    started = time.monotonic()
    down = subprocess.run(base + ["--db-url", "http://127.0.0.1:1/db"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 69, down.stderr
    assert "cannot read http://127.0.0.1:1/db" in down.stderr
    assert time.monotonic() - started < 30


def test_config_file_runs_a_couchdb_feed_and_checks_its_settings(broker, workdir):
    fake, port = start_fake("couchdb", "--flavour", "sync-gateway", "--db", "travel.inv.hotels")
    sub = start_subscriber(broker, "/changes/travel/inv/hotels/*")
    path = os.path.join(workdir, "relay.json")
    feed = {"name": "hotels", "source": "couchdb", "checkpoint": os.path.join(workdir, "hotels.checkpoint"),
            "db_url": f"http://127.0.0.1:{port}/travel.inv.hotels", "channel": ["paris"], "heartbeat": 500,
            "feed": "longpoll"}
    with open(path, "w") as f:
        json.dump({"url": broker.url, "secret": SECRET, "feeds": [feed]}, f)
    relay = Lines([pubsub_bin(), "relay", "run", path])
    try:
        def put_keyspace(doc_id, body, rev=None):
            if rev is not None:
                body = dict(body, _rev=rev)
            return call(port, "PUT", "/travel.inv.hotels/" + doc_id, body)["rev"]
        rev = put_keyspace("h1", {"channels": ["paris"]})
        put_keyspace("h2", {"channels": ["rome"]})
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the paris document")
        put_keyspace("h1", {"channels": ["rome"]}, rev)
        sub.wait_for(lambda: len(sub.lines()) >= 2, 30, "the removal")
        got = events(sub)
        assert [(m["channel"], m["data"]["op"]) for m in got] == [
            ("/changes/travel/inv/hotels/h1", "insert"), ("/changes/travel/inv/hotels/h1", "delete")]
        assert got[1]["data"]["removed"] == ["paris"]
    finally:
        relay.stop()
        sub.stop()
        fake.stop()
    bad = dict(feed, feed="normal")
    with open(path, "w") as f:
        json.dump({"url": broker.url, "feeds": [bad]}, f)
    check = subprocess.run([pubsub_bin(), "relay", "run", "--check", path], capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 64 and "feeds[0].feed" in check.stderr, check.stderr
