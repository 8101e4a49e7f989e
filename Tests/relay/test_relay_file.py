"""Several feeds from a relay configuration file: `pubsub relay run FILE` (over Bayeux) and `pubsub serve --relay
FILE` (in-process), with a real PostgreSQL 15 (the default plugin, pgoutput)."""

import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import psycopg
import pytest

from pubsubtest.broker import Broker, pubsub_bin
from pubsubtest.postgres import PostgresCluster, needs_postgres
from pubsubtest.wait import wait_until
from relaykit import (  # noqa: F401  (fixtures)
    SECRET, Lines, assert_usage_error, events, start_subscriber, broker, workdir)

pytestmark = needs_postgres()


@pytest.fixture
def pg():
    with PostgresCluster() as cluster:
        with psycopg.connect(cluster.conninfo, autocommit=True) as db:
            db.execute("CREATE TABLE notes (id text PRIMARY KEY, body text)")
            db.execute("CREATE TABLE tasks (id int PRIMARY KEY, title text)")
        yield cluster


def write_config(workdir, config):
    path = os.path.join(workdir, "relay.json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def two_feeds(pg, workdir, **top):
    return dict(top, feeds=[
        {"name": "notes", "source": "postgres", "dsn": pg.dsn, "slot": "relay_notes", "table": ["public.notes"],
         "checkpoint": os.path.join(workdir, "notes.checkpoint"), "include_doc": True, "poll_interval": 0.05},
        {"name": "tasks", "source": "postgres", "dsn": pg.dsn, "slot": "relay_tasks", "table": "public.tasks",
         "checkpoint": os.path.join(workdir, "tasks.checkpoint"), "prefix": "/jobs", "poll_interval": 0.05},
    ])


def wait_for_slots(pg, process, names):
    def exist():
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            found = {row[0] for row in db.execute("SELECT slot_name FROM pg_replication_slots")}
        return set(names) <= found
    process.wait_for(exist, 30, "the replication slots")


def write_rows(pg):
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        db.execute("INSERT INTO notes VALUES ('n1', 'hello')")
        db.execute("INSERT INTO tasks VALUES (7, 'build')")
        db.execute("UPDATE notes SET body = 'hello!' WHERE id = 'n1'")


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_relay_run_publishes_every_feed_of_the_file(pg, workdir):
    with Broker(secret=SECRET) as broker:
        notes = start_subscriber(broker, "/changes/public/notes/*")
        tasks = start_subscriber(broker, "/jobs/public/tasks/*")
        config = write_config(workdir, two_feeds(pg, workdir, url=broker.url, secret=SECRET))
        relay = Lines([pubsub_bin(), "relay", "run", config])
        try:
            wait_for_slots(pg, relay, ["relay_notes", "relay_tasks"])
            write_rows(pg)
            notes.wait_for(lambda: len(notes.lines()) >= 2, 30, "2 note events")
            tasks.wait_for(lambda: len(tasks.lines()) >= 1, 30, "1 task event")
            got = events(notes)
            assert [(m["channel"], m["data"]["op"]) for m in got] == [
                ("/changes/public/notes/n1", "insert"), ("/changes/public/notes/n1", "update")]
            assert got[1]["data"]["doc"] == {"id": "n1", "body": "hello!"}
            task = events(tasks)[0]
            assert task["channel"] == "/jobs/public/tasks/7" and "doc" not in task["data"]
            for name in ("notes", "tasks"):
                # The checkpoint is written once the broker's acknowledgement is back, which can be after a
                # subscriber already printed the event.
                path = os.path.join(workdir, f"{name}.checkpoint")
                wait_until(lambda: os.path.exists(path), 10, message=f"{name}.checkpoint written")
                with open(path) as f:
                    assert json.load(f)["source"] == f"pg:relay_{name}"
        finally:
            relay.stop()
            notes.stop()
            tasks.stop()
        assert relay.proc.returncode == 0, relay.errors()


def test_a_failing_feed_is_restarted_and_never_stops_the_others(pg, workdir):
    with Broker(secret=SECRET) as broker:
        notes = start_subscriber(broker, "/changes/public/notes/*")
        config = two_feeds(pg, workdir, url=broker.url, secret=SECRET)
        # The second feed's database does not answer.
        config["feeds"][1]["dsn"] = "postgres://postgres@127.0.0.1:1/postgres"
        relay = Lines([pubsub_bin(), "relay", "run", write_config(workdir, config)])
        try:
            wait_for_slots(pg, relay, ["relay_notes"])
            write_rows(pg)
            notes.wait_for(lambda: len(notes.lines()) >= 2, 30, "2 note events")
            relay.wait_for(lambda: relay.errors().count("restarting it") >= 2, 30, "two restarts of the broken feed")
            assert "pubsub.relay.feed=tasks" in relay.errors()
        finally:
            relay.stop()
            notes.stop()
        assert relay.proc.returncode == 0, relay.errors()


def test_serve_relay_publishes_in_process_and_counts_on_metrics(pg, workdir):
    config = write_config(workdir, two_feeds(pg, workdir))
    with Broker(secret=SECRET, extra_args=["--relay", config]) as broker:
        notes = start_subscriber(broker, "/changes/public/notes/*")
        try:
            wait_for_slots(pg, notes, ["relay_notes", "relay_tasks"])
            write_rows(pg)
            notes.wait_for(lambda: len(notes.lines()) >= 2, 30, "2 note events")
            assert [m["data"]["op"] for m in events(notes)] == ["insert", "update"]
            deadline = time.monotonic() + 10
            while True:
                text = metrics(broker.port)
                if 'pubsub_relay_changes_total{source="pg:relay_tasks"} 1' in text or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert 'pubsub_relay_changes_total{source="pg:relay_notes"} 2' in text
            assert 'pubsub_relay_changes_total{source="pg:relay_tasks"} 1' in text
        finally:
            notes.stop()
        broker.stop()
        assert broker.returncode == 0, broker.log()


def readyz(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_serve_relay_says_on_readyz_what_each_feed_is_doing(pg, workdir):
    """/readyz of `serve --relay` says one line per feed below the broker's own word: a feed relaying, a feed whose
    database does not answer restarting after its error. A feed in trouble never takes the broker out of rotation:
    the status stays 200."""
    config = two_feeds(pg, workdir)
    config["feeds"][1]["dsn"] = "postgres://postgres@127.0.0.1:1/postgres"
    with Broker(secret=SECRET, extra_args=["--relay", write_config(workdir, config)]) as broker:
        def says(*lines):
            status, text = readyz(broker.port)
            return status == 200 and text.startswith("ready\n") and all(line in text for line in lines)
        wait_until(lambda: says("relay notes: relaying\n", "relay tasks: restarting after an error: "), 30,
                   message="/readyz saying what both feeds do", raises=False)
        status, text = readyz(broker.port)
        lines = text.splitlines()
        assert status == 200 and lines[0] == "ready" and len(lines) == 3, text
        assert "relay notes: relaying" in lines[1:], text
        assert [line for line in lines[1:] if line.startswith("relay tasks: restarting after an error: ")], text
        broker.stop()
        assert broker.returncode == 0, broker.log()


def test_serve_relay_counts_a_full_resync_on_metrics(pg, workdir):
    """A checkpoint whose slot is gone: the tables are read in full, logged at error level and counted."""
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        db.execute("INSERT INTO notes VALUES ('old', 'kept')")
    config = two_feeds(pg, workdir)
    with open(config["feeds"][0]["checkpoint"], "w") as f:
        json.dump({"source": "pg:relay_notes", "position": "0/1"}, f)
    path = write_config(workdir, {"feeds": config["feeds"][:1]})
    with Broker(secret=SECRET, extra_args=["--relay", path]) as broker:
        deadline = time.monotonic() + 30
        while True:
            text = metrics(broker.port)
            if 'pubsub_relay_changes_total{source="pg:relay_notes"} 1' in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert 'pubsub_relay_resyncs_total{source="pg:relay_notes"} 1' in text
        assert 'pubsub_relay_changes_total{source="pg:relay_notes"} 1' in text
        broker.stop()
        assert "FULL RESYNC" in broker.log()


@pytest.mark.parametrize("config, message", [
    ("not json", "not valid JSON"),
    ({"feeds": []}, "feeds: expected a non-empty array"),
    ({"feeds": [{"source": "oracle", "checkpoint": "/tmp/x"}]}, "feeds[0].source: unknown source oracle"),
    ({"feeds": [{"source": "postgres", "checkpoint": "/tmp/x", "dsn": "postgres://h/db", "slot": "s",
                 "table": ["public.notes"], "tabel": 1}]}, "feeds[0].tabel: unknown setting"),
    ({"feeds": [{"source": "postgres", "checkpoint": "/tmp/x", "dsn": "postgres://h/db", "slot": "s",
                 "table": ["public.notes"], "plugin": "decoderbufs"}]}, "feeds[0].plugin"),
    ({"feeds": [{"source": "postgres", "checkpoint": "/tmp/x", "dsn": "postgres://h/db", "slot": "Bad-Slot",
                 "table": ["public.notes"]}]}, "feeds[0].slot:"),
    ({"feeds": [{"source": "postgres", "dsn": "postgres://h/db", "slot": "s", "table": ["public.notes"]}]},
     "feeds[0].checkpoint: missing"),
    ({"feeds": [{"source": "postgres", "checkpoint": "/tmp/x", "dsn": "postgres://h/db", "slot": "a",
                 "table": ["notes"]}]}, "feeds[0].table: notes: expected schema.table"),
    ({"feeds": [{"source": "postgres", "checkpoint": "/tmp/same", "dsn": "postgres://h/db", "slot": "a",
                 "table": ["public.a"]},
                {"source": "postgres", "checkpoint": "/tmp/same", "dsn": "postgres://h/db", "slot": "b",
                 "table": ["public.b"]}]}, "feeds[1].checkpoint: /tmp/same is used by two feeds"),
])
@pytest.mark.parametrize("command", ["relay", "serve"])
def test_a_bad_file_is_one_line_and_exit_64(workdir, config, message, command):
    path = os.path.join(workdir, "relay.json")
    with open(path, "w") as f:
        f.write(config if isinstance(config, str) else json.dumps(config))
    cmd = [pubsub_bin(), "relay", "run", path] if command == "relay" else \
        [pubsub_bin(), "serve", "--port", "0", "--relay", path]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 64, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("pubsub: "), result.stderr


def test_a_missing_file_is_one_line_and_exit_64(workdir):
    result = subprocess.run([pubsub_bin(), "relay", "run", os.path.join(workdir, "nope.json")],
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 64 and "cannot read" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_bad_log_level_is_a_usage_error_from_the_flag_and_from_the_variable(workdir):
    path = os.path.join(workdir, "nope.json")
    for args, env in ((["--log-level", "loud"], {}), ([], {"PUBSUB_LOG_LEVEL": "loud"})):
        result = subprocess.run([pubsub_bin(), "relay", "run", *args, path], capture_output=True, text=True,
                                timeout=30, stdin=subprocess.DEVNULL, env={**os.environ, **env})
        assert result.returncode == 64 and "critical" in result.stderr, result.stderr
        assert_usage_error(result.stderr, "'loud'")


def test_check_validates_without_connecting(workdir):
    path = write_config(workdir, {"feeds": [
        {"name": "n", "source": "postgres", "dsn": "postgres://u@127.0.0.1:1/db", "slot": "s", "table": "public.a",
         "checkpoint": os.path.join(workdir, "n.ckpt")}]})
    result = subprocess.run([pubsub_bin(), "relay", "run", "--check", path], capture_output=True, text=True,
                            timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"n: postgres → /changes/…, checkpoint {os.path.join(workdir, 'n.ckpt')}"
    assert not os.path.exists(os.path.join(workdir, "n.ckpt"))
