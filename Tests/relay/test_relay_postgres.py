"""`pubsub relay postgres` against a real PostgreSQL 15, publishing to a real pubsub broker: with the default plugin,
pgoutput (built into the server, streamed over the replication protocol), and the main test with wal2json too."""

import json
import os
import random
import subprocess
import threading
import time

import psycopg
import pytest

from pubsubtest.broker import pubsub_bin
from pubsubtest.postgres import PostgresCluster, needs_postgres, needs_wal2json
from pubsubtest.wait import wait_until
from relaykit import (  # noqa: F401  (broker and workdir are fixtures)
    SECRET, Lines, check_at_least_once, events, start_subscriber, wait_for_ids, broker, workdir)

pytestmark = needs_postgres()

# The output plugins of the relay: a test parametrized over them runs on a cluster that allows wal2json.
PLUGINS = ["pgoutput", pytest.param("wal2json", marks=needs_wal2json())]


@pytest.fixture
def plugin():
    """The relay's output plugin (its default unless a test is parametrized over PLUGINS)."""
    return "pgoutput"


@pytest.fixture
def pg_options():
    """PostgresCluster's options beyond wal2json (a test overrides it with parametrize)."""
    return {}


@pytest.fixture
def pg(plugin, pg_options):
    with PostgresCluster(wal2json=plugin == "wal2json", **pg_options) as cluster:
        with psycopg.connect(cluster.conninfo, autocommit=True) as db:
            db.execute("CREATE TABLE notes (id text PRIMARY KEY, body text, rev int NOT NULL DEFAULT 1)")
            db.execute("CREATE TABLE other (id int PRIMARY KEY)")
        yield cluster


def start_relay(pg, broker, workdir, *extra, plugin=None):
    """The relay with its default plugin (pgoutput), or `--plugin <plugin>` when given."""
    return Lines([pubsub_bin(), "relay", "postgres", "--dsn", pg.dsn, "--slot", "relay_test",
                  "--table", "public.notes", "--checkpoint", os.path.join(workdir, "checkpoint"),
                  "--url", broker.url, "--secret", SECRET, "--poll-interval", "0.05", *extra,
                  *(["--plugin", plugin] if plugin else [])])


def wait_for_slot(pg, relay):
    def exists():
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            return db.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'relay_test'"
                              ).fetchone()[0] == 1
    relay.wait_for(exists, 30, "the replication slot")


@pytest.mark.parametrize("plugin", PLUGINS)
def test_insert_update_delete_arrive_as_events(pg, broker, workdir, plugin):
    """The same events, data and checkpoint from either plugin: pgoutput (the default, no --plugin) and wal2json
    (`--plugin wal2json`, on a cluster whose output_plugin_libraries allows it)."""
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir, "--include-doc", plugin=None if plugin == "pgoutput" else plugin)
    try:
        wait_for_slot(pg, relay)
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            assert db.execute("SELECT plugin FROM pg_replication_slots WHERE slot_name = 'relay_test'"
                              ).fetchone()[0] == plugin
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            db.execute("INSERT INTO notes (id, body) VALUES ('n1', 'hello')")
            with db.transaction():
                db.execute("UPDATE notes SET body = 'hello!', rev = 2 WHERE id = 'n1'")
                db.execute("INSERT INTO notes (id, body) VALUES ('a/b c', 'x')")
            db.execute("INSERT INTO other VALUES (1)")   # not relayed
            db.execute("CREATE TABLE unrelated (x int)")  # an empty transaction
            db.execute("DELETE FROM notes WHERE id = 'n1'")
        sub.wait_for(lambda: len(sub.lines()) >= 4, 30, "4 events")
        time.sleep(0.5)
        got = events(sub)
        assert [(m["channel"], m["data"]["op"], m["data"]["id"]) for m in got] == [
            ("/changes/public/notes/n1", "insert", "n1"),
            ("/changes/public/notes/n1", "update", "n1"),
            ("/changes/public/notes/a$2Fb$20c", "insert", "a/b c"),
            ("/changes/public/notes/n1", "delete", "n1"),
        ]
        first, update = got[0]["data"], got[1]["data"]
        assert first["doc"] == {"id": "n1", "body": "hello", "rev": 1}
        assert update["doc"]["body"] == "hello!" and update["doc"]["rev"] == 2
        assert first["collection"] == "public.notes" and first["source"] == "pg:relay_test"
        assert len({m["data"]["key"] for m in got}) == 4
        assert update["seq"] != got[2]["data"]["seq"] and update["txn"] == got[2]["data"]["txn"]
        # The checkpoint moved past everything, and the slot was advanced to it: past the end of the delete's
        # commit (the LSN its seq starts with), the last change of notes. Read from pg_replication_slots only: a
        # peek of our own would meet the relay's ("replication slot is active for PID …"), and fail one of them.
        last_change = got[3]["data"]["seq"].split(":")[0]
        deadline = time.monotonic() + 10
        while True:
            with open(os.path.join(workdir, "checkpoint")) as f:
                checkpoint = json.load(f)
            with psycopg.connect(pg.conninfo, autocommit=True) as db:
                slot_lsn, checkpoint_ok = db.execute(
                    "SELECT confirmed_flush_lsn::text, confirmed_flush_lsn = %s::pg_lsn FROM pg_replication_slots "
                    "WHERE slot_name = 'relay_test'", (checkpoint["position"],)).fetchone()
                caught_up = db.execute("SELECT %s::pg_lsn >= %s::pg_lsn", (slot_lsn, last_change)).fetchone()[0]
            if (checkpoint_ok and caught_up) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert checkpoint["source"] == "pg:relay_test"
        assert checkpoint_ok, (checkpoint, slot_lsn)
        assert caught_up, (slot_lsn, last_change)
        # Truncate goes to the collection's channel.
        whole = start_subscriber(broker, "/changes/public/notes")
        try:
            with psycopg.connect(pg.conninfo, autocommit=True) as db:
                db.execute("TRUNCATE notes")
            try:
                whole.wait_for(lambda: len(whole.lines()) >= 1, 30, "the truncate event")
            except AssertionError as e:
                # Seen once in a full run under load (not alone): the relay's own log says where it stopped.
                raise AssertionError(f"{e}\nrelay log:\n{relay.errors()[-3000:]}") from None
            assert events(whole)[0]["data"]["op"] == "truncate"
        finally:
            whole.stop()
    finally:
        relay.stop()
        sub.stop()
    assert relay.proc.returncode == 0, relay.errors()


def test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys(pg, broker, workdir):
    total = 1000
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir, "--batch-size", "20", "--max-changes", "50")
    second = None
    writer_error = []
    try:
        wait_for_slot(pg, relay)

        def write():
            try:
                with psycopg.connect(pg.conninfo, autocommit=True) as db:
                    for i in range(total):
                        db.execute("INSERT INTO notes (id, body) VALUES (%s, 'x')", (f"n{i}",))
                        if i % 100 == 0:
                            time.sleep(0.02)
            except Exception as e:  # reported by the main thread
                writer_error.append(e)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        sub.wait_for(lambda: len(sub.lines()) >= 150, 60, "150 events before the kill")
        relay.kill9()
        killed_at = [len(sub.lines())]
        writer.join(timeout=120)
        assert not writer.is_alive() and not writer_error, writer_error
        second = start_relay(pg, broker, workdir, "--batch-size", "20", "--max-changes", "50")
        # Two more kills while it catches up, at moments that fall anywhere in publish/ack/persist/confirm.
        for threshold in (400, 650):
            sub.wait_for(lambda: len(sub.lines()) >= threshold, 60, f"{threshold} events before the next kill")
            time.sleep(random.uniform(0, 0.03))
            second.kill9()
            killed_at.append(len(sub.lines()))
            second = start_relay(pg, broker, workdir, "--batch-size", "20", "--max-changes", "50")

        ids = [f"n{i}" for i in range(total)]
        wait_for_ids(sub, ids, 120, f"all {total} inserts")
        time.sleep(0.5)
        # Commit order is kept: each id's first delivery comes in insert order.
        duplicates = check_at_least_once(events(sub), ids, same=("key", "seq"))
        print(f"killed after {killed_at} events; {duplicates} duplicates for {total} changes")
    finally:
        relay.stop()
        if second is not None:
            second.stop()
        sub.stop()


def test_survives_a_postgresql_crash_and_restart(pg, broker, workdir):
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir, "--batch-size", "20", "--max-changes", "50")
    try:
        wait_for_slot(pg, relay)
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            for i in range(300):
                db.execute("INSERT INTO notes (id, body) VALUES (%s, 'x')", (f"n{i}",))
        sub.wait_for(lambda: len(sub.lines()) >= 100, 60, "100 events before the crash")
        pg.restart("immediate")
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            for i in range(300, 600):
                db.execute("INSERT INTO notes (id, body) VALUES (%s, 'x')", (f"n{i}",))

        ids = [f"n{i}" for i in range(600)]
        try:
            wait_for_ids(sub, ids, 90, "all 600 inserts after the restart")
        except AssertionError as e:
            raise AssertionError(f"{e}\nrelay:\n{relay.errors()[-3000:]}") from None
        assert relay.proc.poll() is None, relay.errors()
        assert "lost the connection to PostgreSQL" in relay.errors()
        assert "reconnected to PostgreSQL" in relay.errors()
        check_at_least_once(events(sub), ids, ordered=False)
    finally:
        relay.stop()
        sub.stop()


def test_a_terminated_backend_reconnects_without_a_gap(pg, broker, workdir):
    """`pg_terminate_backend` (as an operator or a failover tool does) ends the relay's sessions, six times while
    changes are written: the relay finds the socket closed (or, for a query in flight, SQLSTATE 57P01 just before
    it closes), reconnects, and relays every change. Its sessions are client backends and, streaming with pgoutput,
    a walsender (a replication=database connection has the database's name too)."""
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir, "--batch-size", "20", "--max-changes", "50")
    terminated = 0
    try:
        wait_for_slot(pg, relay)
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            for round in range(6):
                for i in range(round * 50, round * 50 + 50):
                    db.execute("INSERT INTO notes (id, body) VALUES (%s, 'x')", (f"n{i}",))
                terminated += db.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                    "AND datname = current_database() AND backend_type IN ('client backend', 'walsender')"
                ).fetchone()[0]
                time.sleep(0.3)
        ids = [f"n{i}" for i in range(300)]
        try:
            wait_for_ids(sub, ids, 90, "all 300 inserts")
        except AssertionError as e:
            raise AssertionError(f"{e}\nrelay:\n{relay.errors()[-3000:]}") from None
        assert terminated >= 3, terminated
        assert relay.proc.poll() is None, relay.errors()
        assert "reconnected to PostgreSQL" in relay.errors()
        check_at_least_once(events(sub), ids, ordered=False)
    finally:
        relay.stop()
        sub.stop()


def relay_until_caught_up(pg, broker, workdir, sub, count):
    """Runs the relay until `count` events arrived, then stops it cleanly (checkpoint written)."""
    relay = start_relay(pg, broker, workdir)
    try:
        wait_for_slot(pg, relay)
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            for i in range(count):
                db.execute("INSERT INTO notes (id, body) VALUES (%s, 'v1')", (f"n{i}",))
        sub.wait_for(lambda: len(sub.lines()) >= count, 30, f"{count} events")
        time.sleep(0.3)
    finally:
        relay.stop()
    assert relay.proc.returncode == 0, relay.errors()


# The cluster of the "invalidated" case: a slot may hold back 1 MB of WAL (in 1 MB segments), then it is lost.
SMALL_WAL = {"settings": {"max_slot_wal_keep_size": "1MB"}, "wal_segsize": 1}


def invalidate_slot(pg):
    """Writes WAL (to a table the relay does not follow) and checkpoints until the checkpointer invalidates the
    idle slot for holding back more than max_slot_wal_keep_size: pg_replication_slots.wal_status = 'lost'."""
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        db.execute("CREATE TABLE filler (x text)")

        def lost():
            db.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 1000)")
            db.execute("SELECT pg_switch_wal()")
            db.execute("CHECKPOINT")
            return db.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'relay_test'"
                              ).fetchone()[0] == "lost"
        wait_until(lost, 60, interval=0, message="the slot invalidated (wal_status 'lost')")


@pytest.mark.parametrize("how, pg_options", [pytest.param("dropped", {}, id="dropped"),
                                             pytest.param("advanced", {}, id="advanced"),
                                             pytest.param("invalidated", SMALL_WAL, id="invalidated")])
def test_a_lost_position_means_a_full_resync_then_live_changes(pg, broker, workdir, how):
    """The slot cannot give the changes since the checkpoint: dropped, advanced past it by hand, or invalidated by
    max_slot_wal_keep_size while the relay was stopped (wal_status 'lost'). The relay announces a full resync, sends
    every row as an update, then live changes; started again, it resyncs nothing."""
    sub = start_subscriber(broker)
    relay_until_caught_up(pg, broker, workdir, sub, 3)
    before = len(sub.lines())
    if how == "invalidated":
        invalidate_slot(pg)  # the rows below change once the slot is lost
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        if how == "dropped":
            db.execute("SELECT pg_drop_replication_slot('relay_test')")
        # Changes the relay will never see from the slot; a column named like the resync's row alias.
        db.execute("ALTER TABLE notes ADD COLUMN t double precision DEFAULT 1.5")
        db.execute("UPDATE notes SET body = 'v2' WHERE id = 'n0'")
        db.execute("INSERT INTO notes (id, body) VALUES ('late', 'v1')")
        db.execute("DELETE FROM notes WHERE id = 'n2'")
        if how == "advanced":
            db.execute("SELECT pg_replication_slot_advance('relay_test', pg_current_wal_lsn())")
    relay = start_relay(pg, broker, workdir, "--include-doc")
    try:
        sub.wait_for(lambda: len(sub.lines()) >= before + 3, 30, "the resync events")
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            db.execute("INSERT INTO notes (id, body) VALUES ('after', 'v1')")
        sub.wait_for(lambda: any(m["data"]["id"] == "after" for m in events(sub)), 30, "a live change after it")
        got = events(sub)[before:]
        resynced = [m["data"] for m in got if m["data"].get("resync")]
        assert sorted(d["id"] for d in resynced) == ["late", "n0", "n1"]
        assert all(d["op"] == "update" for d in resynced)
        assert {d["id"]: d["doc"]["body"] for d in resynced} == {"late": "v1", "n0": "v2", "n1": "v1"}
        assert all(d["doc"]["t"] == 1.5 for d in resynced)
        live = [m["data"] for m in got if not m["data"].get("resync")]
        assert [(d["id"], d["op"]) for d in live] == [("after", "insert")]
        assert "FULL RESYNC" in relay.errors() and "pubsub.relay.reason" in relay.errors()
    finally:
        relay.stop()
        sub.stop()
    assert relay.proc.returncode == 0, relay.errors()
    # Started again: nothing is resynced twice.
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir)
    try:
        wait_for_slot(pg, relay)
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            db.execute("INSERT INTO notes (id, body) VALUES ('again', 'v1')")
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "a live change")
        time.sleep(0.5)
        assert [m["data"]["id"] for m in events(sub)] == ["again"]
        assert "FULL RESYNC" not in relay.errors()
    finally:
        relay.stop()
        sub.stop()


def test_bad_arguments_and_unreachable_database(workdir):
    base = [pubsub_bin(), "relay", "postgres", "--checkpoint", os.path.join(workdir, "c"), "--url",
            "http://127.0.0.1:9/faye"]
    bad = subprocess.run(base + ["--dsn", "mysql://x", "--slot", "s", "--table", "public.notes"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 64 and "dsn" in bad.stderr
    bad = subprocess.run(base + ["--dsn", "postgres://127.0.0.1/x", "--slot", "Bad-Slot", "--table", "public.notes"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 64 and "--slot" in bad.stderr
    bad = subprocess.run(base + ["--dsn", "postgres://127.0.0.1/x", "--slot", "s", "--table", "notes"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 64 and "schema.table" in bad.stderr
    started = time.monotonic()
    down = subprocess.run(base + ["--dsn", "postgres://postgres@127.0.0.1:1/postgres", "--slot", "s", "--table",
                                  "public.notes"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 69, down.stderr
    assert "cannot connect to PostgreSQL at 127.0.0.1:1" in down.stderr
    assert time.monotonic() - started < 30


def test_tls_to_postgresql_with_a_verified_certificate(broker, workdir):
    with PostgresCluster(tls=True) as pg:
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            db.execute("CREATE TABLE notes (id text PRIMARY KEY, body text)")
        base = [pubsub_bin(), "relay", "postgres", "--slot", "relay_test", "--table", "public.notes",
                "--checkpoint", os.path.join(workdir, "checkpoint"), "--url", broker.url, "--secret", SECRET,
                "--poll-interval", "0.05"]
        # A certificate nobody vouches for is refused with verify-full and a system root store.
        refused = subprocess.run(base + ["--dsn", f"postgres://postgres@localhost:{pg.port}/postgres?sslmode=verify-full"],
                                 capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert refused.returncode == 69 and "CERTIFICATE_VERIFY_FAILED" in refused.stderr, refused.stderr
        sub = start_subscriber(broker)
        relay = Lines(base + ["--dsn", f"postgres://postgres@localhost:{pg.port}/postgres"
                              f"?sslmode=verify-full&sslrootcert={pg.ca_file}"])
        try:
            wait_for_slot(pg, relay)
            with psycopg.connect(pg.conninfo, autocommit=True) as db:
                db.execute("INSERT INTO notes VALUES ('t1', 'over TLS')")
                # The relay's sessions: client backends, and its walsender when it streams (pgoutput).
                encrypted, sessions = db.execute(
                    "SELECT bool_and(ssl), count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a "
                    "ON a.pid = s.pid WHERE a.backend_type IN ('client backend', 'walsender') "
                    "AND a.pid <> pg_backend_pid() AND a.datname = 'postgres'").fetchone()
            sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the event")
            assert events(sub)[0]["data"]["id"] == "t1"
            assert sessions >= 1 and encrypted is True, (sessions, encrypted)
        finally:
            relay.stop()
            sub.stop()
    bad = subprocess.run(base[:2] + ["postgres", "--dsn", "postgres://h/db?sslmode=sometimes", "--slot", "s",
                                     "--table", "public.notes", "--checkpoint", "c"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 64 and "sslmode=sometimes" in bad.stderr
