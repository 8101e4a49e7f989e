"""`pubsub relay postgres` with its default plugin, pgoutput: built into PostgreSQL (no extension, allowed by the
default output_plugin_libraries of 15.19 and later), streamed over the replication protocol (START_REPLICATION on
a replication=database connection) through a publication. On a real PostgreSQL 15 and a real broker: the slot and
publication it makes or uses, password authentication (SCRAM-SHA-256, MD5) with and without TLS, the errors that
stop it (one line, exit 69), a busy database whose relayed tables are quiet (the slot keeps up, WAL stays bounded),
and a walsender terminated mid-stream."""

import json
import os
import re
import signal
import subprocess
import threading
import time

import psycopg
import pytest

from pubsubtest.broker import Broker, pubsub_bin
from pubsubtest.postgres import BUILT_IN_PLUGINS, PostgresCluster, needs_postgres, needs_wal2json, \
    restricts_output_plugins
from pubsubtest.wait import wait_until
from relaykit import (  # noqa: F401  (broker and workdir are fixtures)
    SECRET, Lines, check_at_least_once, events, start_subscriber, wait_for_ids, broker, workdir)

pytestmark = needs_postgres()

SLOT = "relay_test"
MB = 1024 * 1024
# A log line of the relay's logger below warning ("2026-01-01T00:00:00+0000 info pubsub.relay: ..."): not an error.
QUIET_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\S+ (trace|debug|info|notice) ")
NOISE = re.compile(r"Traceback|Fatal error|Stack dump|stack trace|backtrace|^\s*#\d+ |^\s*at /|\bSIG[A-Z]+\b")


def make_tables(cluster):
    with cluster.connect() as db:
        db.execute("CREATE TABLE notes (id text PRIMARY KEY, body text, rev int NOT NULL DEFAULT 1)")
        db.execute("CREATE TABLE other (id int PRIMARY KEY, filler text)")  # never relayed
    return cluster


@pytest.fixture
def pg():
    """A cluster with PostgreSQL's default settings (beyond wal_level=logical): output_plugin_libraries untouched."""
    with PostgresCluster() as cluster:
        yield make_tables(cluster)


def relay_command(pg, broker, workdir, *extra, dsn=None, slot=SLOT):
    return [pubsub_bin(), "relay", "postgres", "--dsn", dsn or pg.dsn, "--slot", slot, "--table", "public.notes",
            "--checkpoint", os.path.join(workdir, f"{slot}.checkpoint"), "--url", broker.url, "--secret", SECRET,
            *extra]


def start_relay(pg, broker, workdir, *extra, **kwargs):
    return Lines(relay_command(pg, broker, workdir, *extra, **kwargs))


def run_relay(pg, broker, workdir, *extra, **kwargs):
    """The relay run to its exit (an error that stops it); with its duration."""
    started = time.monotonic()
    run = subprocess.run(relay_command(pg, broker, workdir, *extra, **kwargs), capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    return run, time.monotonic() - started


def the_error_line(stderr):
    """The one line of an error that stopped the relay: every other line of stderr is a log line below warning
    ("relay starting"), and nothing looks like a crash (a trace, a signal, a Swift fatal error)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert not [line for line in lines if NOISE.search(line)], stderr
    errors = [line for line in lines if not QUIET_LOG_LINE.match(line)]
    assert len(errors) == 1, stderr
    return errors[0]


def query(pg, sql, *args):
    with pg.connect() as db:
        return db.execute(sql, args or None).fetchall()


def slot(pg, name=SLOT):
    """The slot's row of pg_replication_slots as a dict, or None."""
    with pg.connect() as db:
        cursor = db.execute("SELECT slot_name, plugin, slot_type, database, active, active_pid, restart_lsn::text, "
                            "confirmed_flush_lsn::text, wal_status FROM pg_replication_slots WHERE slot_name = %s",
                            (name,))
        row = cursor.fetchone()
        return dict(zip([c.name for c in cursor.description], row)) if row else None


def publication_tables(pg, name):
    """The tables of publication `name` as schema.table, sorted; None when it does not exist."""
    with pg.connect() as db:
        if not db.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone():
            return None
        return sorted(f"{s}.{t}" for s, t in db.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,)))


def wait(relay, predicate, timeout, what, interval=0.2, detail=None):
    """Polls `predicate` (a query: every `interval` seconds) until it holds; fails with the relay's log when the
    relay exits first or `timeout` passes (and with `detail()`, the last reading, when given)."""
    def check():
        return predicate() or relay.proc.poll() is not None
    wait_until(check, timeout, interval=interval, raises=False)
    if predicate():
        return
    last = f" ({detail()})" if detail else ""
    if relay.proc.poll() is not None:
        relay.stop()  # its last lines read
        raise AssertionError(f"the relay exited with {relay.proc.returncode} before {what}{last}:\n"
                             f"{relay.errors()}")
    raise AssertionError(f"{what} not within {timeout}s{last}; relay:\n{relay.errors()[-3000:]}")


def wait_streaming(pg, relay, name=SLOT, timeout=30):
    """Until the relay's walsender streams the slot (pg_stat_replication.state 'streaming'); returns its pid."""
    def streaming():
        rows = query(pg, "SELECT s.pid FROM pg_stat_replication s JOIN pg_replication_slots r "
                         "ON r.active_pid = s.pid WHERE r.slot_name = %s AND s.state = 'streaming'", name)
        return rows[0][0] if rows else None
    wait(relay, streaming, timeout, f"the relay streaming slot {name}")
    return streaming()


def ids_of(sub):
    return [m["data"]["id"] for m in events(sub)]


def insert(pg, *ids, table="notes"):
    with pg.connect() as db:
        for id in ids:
            db.execute(f"INSERT INTO {table} (id, body) VALUES (%s, 'x')", (id,))


# ---------------------------------------------------------------- a. no extension: pgoutput on a default server

def writer_of(pg, prefix, pause):
    """A thread (not started) inserting rows <prefix>00000, <prefix>00001, … one a transaction, `pause` seconds
    apart, until `stop` is set: the ids written, the stop event, the failures, the thread."""
    written, stop, failure = [], threading.Event(), []

    def write():
        try:
            with pg.connect() as db:
                i = 0
                while not stop.is_set():
                    db.execute("INSERT INTO notes (id, body) VALUES (%s, 'x')", (f"{prefix}{i:05d}",))
                    written.append(f"{prefix}{i:05d}")
                    i += 1
                    time.sleep(pause)
        except Exception as e:  # reported by the test
            failure.append(e)

    return written, stop, failure, threading.Thread(target=write, daemon=True)


def test_the_relay_streams_a_pgoutput_slot_on_a_server_that_allows_no_extension_plugin(pg, broker, workdir):
    with pg.connect() as db:
        assert [r[0] for r in db.execute("SELECT extname FROM pg_extension")] == ["plpgsql"]
        if restricts_output_plugins(pg.bindir):
            # The server of this test refuses wal2json: whatever the relay does, it needs no extension plugin.
            assert db.execute("SHOW output_plugin_libraries").fetchone()[0] == BUILT_IN_PLUGINS
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="may not be used as an output plugin"):
                db.execute("SELECT pg_create_logical_replication_slot('by_hand', 'wal2json')")
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir, "--include-doc")
    try:
        wait(relay, lambda: slot(pg), 30, "the replication slot")
        made = slot(pg)
        assert (made["plugin"], made["slot_type"], made["database"]) == ("pgoutput", "logical", "postgres"), made
        assert publication_tables(pg, f"pubsub_{SLOT}") == ["public.notes"]
        # Streamed by a walsender (START_REPLICATION), not read by SQL peeks of a client backend.
        walsender = wait_streaming(pg, relay)
        assert query(pg, "SELECT backend_type FROM pg_stat_activity WHERE pid = %s", walsender) == [("walsender",)]
        with pg.connect() as db:
            db.execute("INSERT INTO notes (id, body) VALUES ('n1', 'hello')")
            db.execute("INSERT INTO other VALUES (1, 'not relayed')")
            db.execute("UPDATE notes SET body = 'hello!', rev = 2 WHERE id = 'n1'")
            db.execute("DELETE FROM notes WHERE id = 'n1'")
        sub.wait_for(lambda: len(sub.lines()) >= 3, 30, "3 events")
        got = events(sub)
        assert [(m["channel"], m["data"]["op"]) for m in got] == [
            ("/changes/public/notes/n1", "insert"), ("/changes/public/notes/n1", "update"),
            ("/changes/public/notes/n1", "delete")]
        assert got[0]["data"]["doc"] == {"id": "n1", "body": "hello", "rev": 1}
        assert got[1]["data"]["doc"] == {"id": "n1", "body": "hello!", "rev": 2}
        assert all(m["data"]["source"] == f"pg:{SLOT}" and m["data"]["collection"] == "public.notes" for m in got)
        # Still no extension, and the only slot is the relay's.
        assert query(pg, "SELECT extname FROM pg_extension") == [("plpgsql",)]
        assert query(pg, "SELECT slot_name, plugin FROM pg_replication_slots") == [(SLOT, "pgoutput")]
    finally:
        relay.stop()
        sub.stop()
    assert relay.proc.returncode == 0, relay.errors()


def test_changes_committed_while_the_relay_starts_are_relayed_from_the_slots_start(pg, broker, workdir):
    """A writer commits rows before, while and after the relay makes its publication and slot. pgoutput decodes a
    change with the catalog of its time: the publication must exist before the slot's start, or a change committed
    between the two could never be decoded ('publication "pubsub_relay_test" does not exist', at every try). What
    arrives is every row from some row on, without a gap, up to the last."""
    written, stop, failure, writer = writer_of(pg, "s", pause=0.002)
    writer.start()
    sub = start_subscriber(broker)
    relay = None
    try:
        wait_until(lambda: len(written) >= 20, 30, interval=0.05, message="rows written before the relay starts")
        relay = start_relay(pg, broker, workdir)
        wait(relay, lambda: slot(pg), 30, "the replication slot")
        at_slot = len(written)
        wait_until(lambda: len(written) >= at_slot + 100, 30, interval=0.05, message="rows written after the slot")
        stop.set()
        writer.join(timeout=30)
        assert not writer.is_alive() and not failure, failure
        wait(relay, lambda: written[-1] in ids_of(sub), 30, f"the last row written, {written[-1]}")
        got = list(dict.fromkeys(ids_of(sub)))
        first = written.index(got[0])
        assert got == written[first:], f"not every row from {got[0]} on: {sorted(set(written[first:]) - set(got))}"
        assert 0 < first <= at_slot, (first, at_slot)  # rows before the slot are not in it; the rows after are
    finally:
        stop.set()
        if relay is not None:
            relay.stop()
        sub.stop()
    assert relay.proc.returncode == 0, relay.errors()


# ---------------------------------------------------------------- b. password authentication, TLS

PASSWORDS = {"scram-sha-256": "s3cret:/@?#% pw", "md5": "md5-secret-pw"}
STORED = {"scram-sha-256": "SCRAM-SHA-256$", "md5": "md5"}
# A password SASLprep changes (RFC 4013): a decomposed "a" + diaeresis (normalized to one "ä"), a no-break space
# (mapped to a space), a soft hyphen (mapped to nothing). PostgreSQL stores a SCRAM verifier of the prepared form
# and an MD5 hash of the raw one.
UNPREPARED = "pa\u0308ss\u00a0wo\u00adrd-\u00fc"
# One SASLprep only normalizes: canonically equal to its prepared form, other bytes.
COMPOSED_ONLY = "pa\u0308sswort"


@pytest.mark.parametrize("method, password", [
    ("scram-sha-256", PASSWORDS["scram-sha-256"]), ("md5", PASSWORDS["md5"]),
    ("scram-sha-256", UNPREPARED), ("md5", UNPREPARED), ("scram-sha-256", COMPOSED_ONLY)],
    ids=["scram", "md5", "scram-saslprep", "md5-saslprep", "scram-normalized"])
def test_password_authentication_over_tcp(broker, workdir, method, password):
    """pg_hba.conf asks for `method` on TCP (host and replication lines), the password is stored by that method:
    the relay authenticates both its connections with the password of its DSN (percent-escaped in the URL), a
    SCRAM password SASLprep'd as PostgreSQL prepares it."""
    with PostgresCluster(auth=method, password=password) as pg:
        make_tables(pg)
        assert query(pg, "SELECT left(rolpassword, %s) FROM pg_authid WHERE rolname = 'postgres'",
                     len(STORED[method])) == [(STORED[method],)]
        with pytest.raises(psycopg.OperationalError):  # without the password: refused
            psycopg.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres connect_timeout=10").close()
        sub = start_subscriber(broker)
        relay = start_relay(pg, broker, workdir)
        try:
            wait(relay, lambda: slot(pg), 30, "the replication slot")
            walsender = wait_streaming(pg, relay)
            assert query(pg, "SELECT client_addr::text FROM pg_stat_activity WHERE pid = %s", walsender) == [
                ("127.0.0.1/32",)]
            insert(pg, "a1", "a2")
            sub.wait_for(lambda: len(sub.lines()) >= 2, 30, "2 events")
            assert ids_of(sub) == ["a1", "a2"]
        finally:
            relay.stop()
            sub.stop()
        assert relay.proc.returncode == 0, relay.errors()
        assert password not in relay.errors() and pg.dsn not in relay.errors()


@pytest.mark.parametrize("method", ["scram-sha-256", "md5"])
def test_a_wrong_password_is_one_line_and_exit_69(broker, workdir, method):
    with PostgresCluster(auth=method) as pg:
        make_tables(pg)
        wrong = "not-the-password-123"
        run, took = run_relay(pg, broker, workdir, dsn=pg.url(password=wrong))
        assert run.returncode == 69, (run.returncode, run.stderr)
        assert took < 30
        line = the_error_line(run.stderr)
        assert re.search(r"password authentication failed", line, re.I), run.stderr
        assert wrong not in run.stderr and pg.password not in run.stderr
        assert run.stdout == ""
        assert slot(pg) is None and publication_tables(pg, f"pubsub_{SLOT}") is None


def test_tls_with_scram_and_a_verified_certificate(broker, workdir):
    """hostssl lines with SCRAM-SHA-256: the relay verifies the server's certificate (sslmode=verify-full, the
    cluster's CA as sslrootcert), then authenticates; without TLS the server refuses it."""
    with PostgresCluster(tls=True, auth="scram-sha-256") as pg:
        make_tables(pg)
        plain, _ = run_relay(pg, broker, workdir, dsn=pg.url(host="localhost", sslmode="disable"))
        assert plain.returncode == 69, plain.stderr
        assert "no encryption" in the_error_line(plain.stderr), plain.stderr
        sub = start_subscriber(broker)
        relay = start_relay(pg, broker, workdir, dsn=pg.url(host="localhost", sslmode="verify-full",
                                                            sslrootcert=pg.ca_file))
        try:
            wait(relay, lambda: slot(pg), 30, "the replication slot")
            walsender = wait_streaming(pg, relay)
            insert(pg, "t1")
            sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the event")
            assert ids_of(sub) == ["t1"]
            assert query(pg, "SELECT ssl FROM pg_stat_ssl WHERE pid = %s", walsender) == [(True,)]
        finally:
            relay.stop()
            sub.stop()
        assert relay.proc.returncode == 0, relay.errors()


# ---------------------------------------------------------------- c. a slot of another plugin

@pytest.mark.parametrize("existing, relay_plugin", [
    ("test_decoding", "pgoutput"),
    pytest.param("wal2json", "pgoutput", marks=needs_wal2json()),
    pytest.param("pgoutput", "wal2json", marks=needs_wal2json()),
])
def test_a_slot_of_another_plugin_is_one_line_and_exit_69_and_left_alone(broker, workdir, existing, relay_plugin):
    with PostgresCluster(wal2json="wal2json" in (existing, relay_plugin)) as pg:
        make_tables(pg)
        with pg.connect() as db:
            db.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (SLOT, existing))
            db.execute("INSERT INTO notes (id, body) VALUES ('pending', 'x')")  # a change the slot holds
        before = slot(pg)
        extra = ["--plugin", relay_plugin] if relay_plugin != "pgoutput" else []
        run, took = run_relay(pg, broker, workdir, *extra, "--poll-interval", "0.05")
        assert run.returncode == 69, (run.returncode, run.stderr)
        assert took < 30
        line = the_error_line(run.stderr)
        assert existing in line and relay_plugin in line and SLOT in line, run.stderr
        # The slot is as it was: not dropped, not advanced, its change still there.
        assert slot(pg) is not None, "the slot was dropped"
        wait_until(lambda: not slot(pg)["active"], 10, interval=0.2, message="the slot released")
        after = slot(pg)
        assert {k: after[k] for k in ("plugin", "restart_lsn", "confirmed_flush_lsn")} == \
               {k: before[k] for k in ("plugin", "restart_lsn", "confirmed_flush_lsn")}
        if existing != "pgoutput":  # (a text plugin: peeked without options)
            changes = [r[0] for r in query(pg, "SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)",
                                           SLOT)]
            assert any("pending" in c for c in changes), changes


# ---------------------------------------------------------------- d. the publication

def test_a_named_publication_is_used_as_it_is(pg, broker, workdir):
    """--publication names one the operator made, here of inserts only: the relay reads through it (an update is
    not published), makes no publication of its own and leaves that one as it was."""
    with pg.connect() as db:
        db.execute("CREATE PUBLICATION mine FOR TABLE notes WITH (publish = 'insert')")
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir, "--publication", "mine")
    try:
        wait(relay, lambda: slot(pg), 30, "the replication slot")
        wait_streaming(pg, relay)
        with pg.connect() as db:
            db.execute("INSERT INTO notes (id, body) VALUES ('n1', 'x')")
            db.execute("UPDATE notes SET body = 'y' WHERE id = 'n1'")  # not in the publication
            db.execute("INSERT INTO notes (id, body) VALUES ('n2', 'x')")
        sub.wait_for(lambda: "n2" in ids_of(sub), 30, "the second insert")
        assert [(m["data"]["id"], m["data"]["op"]) for m in events(sub)] == [("n1", "insert"), ("n2", "insert")]
        assert slot(pg)["plugin"] == "pgoutput"
        assert publication_tables(pg, f"pubsub_{SLOT}") is None
        assert publication_tables(pg, "mine") == ["public.notes"]
        assert query(pg, "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication "
                         "WHERE pubname = 'mine'") == [(True, False, False, False)]
    finally:
        relay.stop()
        sub.stop()
    assert relay.proc.returncode == 0, relay.errors()


def test_a_missing_named_publication_is_one_line_and_exit_69(pg, broker, workdir):
    run, took = run_relay(pg, broker, workdir, "--publication", "nowhere")
    assert run.returncode == 69, (run.returncode, run.stderr)
    assert took < 30
    line = the_error_line(run.stderr)
    assert "nowhere" in line and "publication" in line.lower(), run.stderr
    # Not made in its place, nor the default one.
    assert query(pg, "SELECT pubname FROM pg_publication") == []


def test_a_relay_refused_at_start_leaves_no_slot_behind(pg, broker, workdir):
    """A slot nobody reads holds the server's WAL until the disk fills (or max_slot_wal_keep_size loses it): a relay
    that stops before it ever streams, here for a missing --publication, leaves none (it checks before it makes the
    slot, or drops the slot it just made)."""
    run, _ = run_relay(pg, broker, workdir, "--publication", "nowhere")
    assert run.returncode == 69, (run.returncode, run.stderr)
    assert slot(pg) is None, (slot(pg), run.stderr)


def test_a_table_without_replica_identity_is_refused_before_it_is_published(pg, broker, workdir):
    """Published without a replica identity, a table's UPDATE and DELETE fail in the application ("cannot update
    table … because it does not have a replica identity and publishes updates"): the relay refuses it at start, with
    the fix, and publishes nothing, makes no slot, and the application's writes go on."""
    with pg.connect() as db:
        db.execute("CREATE TABLE keyless (body text)")
        db.execute("INSERT INTO keyless VALUES ('a')")
    started = time.monotonic()
    run = subprocess.run([pubsub_bin(), "relay", "postgres", "--dsn", pg.dsn, "--slot", SLOT, "--table",
                          "public.keyless", "--checkpoint", os.path.join(workdir, "k.checkpoint"), "--url", broker.url,
                          "--secret", SECRET], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert run.returncode == 64, (run.returncode, run.stderr)
    assert time.monotonic() - started < 30
    line = the_error_line(run.stderr)
    assert "public.keyless" in line and "REPLICA IDENTITY FULL" in line, run.stderr
    assert query(pg, "SELECT pubname FROM pg_publication") == []
    assert slot(pg) is None
    with pg.connect() as db:
        db.execute("UPDATE keyless SET body = 'b'")
        db.execute("DELETE FROM keyless")


def test_the_default_publication_is_made_once_and_reused_on_restart(pg, broker, workdir):
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir)
    second = None
    try:
        wait(relay, lambda: slot(pg), 30, "the replication slot")
        assert publication_tables(pg, f"pubsub_{SLOT}") == ["public.notes"]
        made = query(pg, "SELECT oid, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication")
        assert len(made) == 1 and made[0][1:] == (True, True, True, True), made
        insert(pg, "a1")
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the first event")
        relay.stop()
        assert relay.proc.returncode == 0, relay.errors()
        second = start_relay(pg, broker, workdir)
        wait_streaming(pg, second)
        insert(pg, "a2")
        sub.wait_for(lambda: "a2" in ids_of(sub), 30, "the event after the restart")
        assert ids_of(sub) == ["a1", "a2"]
        # The same publication (not dropped and made again), and no other.
        assert query(pg, "SELECT oid, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication") == made
        assert publication_tables(pg, f"pubsub_{SLOT}") == ["public.notes"]
        assert "FULL RESYNC" not in second.errors()
    finally:
        relay.stop()
        if second is not None:
            second.stop()
        sub.stop()


# ---------------------------------------------------------------- e. a busy database, a quiet relayed table

def wal_behind(pg, column):
    """Bytes of WAL between the server's current position and the slot's `column` (restart_lsn,
    confirmed_flush_lsn); None while the slot has none."""
    return query(pg, f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), {column})::bigint FROM pg_replication_slots "
                     "WHERE slot_name = %s", SLOT)[0][0]


@pytest.mark.timeout(300)
def test_a_busy_database_with_a_quiet_relayed_table_keeps_the_slot_moving(pg, broker, workdir):
    """~64 MB of WAL in 64 transactions to a table the relay does not follow: nothing to publish, yet the slot's
    confirmed position follows the server (the relay answers keepalives and confirms the server's position once
    nothing is in flight), so the WAL the slot retains stays bounded. Then a relayed change still arrives, and a
    restart resumes from the checkpoint without a full resync or a repeat."""
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir)
    second = None
    try:
        wait(relay, lambda: slot(pg), 30, "the replication slot")
        insert(pg, "warm")
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the first event")
        start = query(pg, "SELECT pg_current_wal_lsn()::text")[0][0]
        with pg.connect() as db:
            for i in range(64):
                db.execute("INSERT INTO other SELECT g, repeat(md5(g::text), 31) "
                           "FROM generate_series(%s::int, %s::int) g", (i * 1000, i * 1000 + 999))
        written = query(pg, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint", start)[0][0]
        assert written >= 60 * MB, written
        assert relay.proc.poll() is None, relay.errors()

        def confirmed_close():
            behind = wal_behind(pg, "confirmed_flush_lsn")
            return behind is not None and behind < 4 * MB
        wait(relay, confirmed_close, 90, "the slot's confirmed_flush_lsn within 4 MB of the server's position",
             detail=lambda: f"{wal_behind(pg, 'confirmed_flush_lsn')} bytes behind, {written} written")

        def retained_bounded():
            with pg.connect() as db:
                db.execute("CHECKPOINT")  # logs the running transactions the slot's restart point moves to
            behind = wal_behind(pg, "restart_lsn")
            return behind is not None and behind < 16 * MB
        wait(relay, retained_bounded, 90, "the slot's restart_lsn within 16 MB of the server's position",
             interval=1, detail=lambda: f"{wal_behind(pg, 'restart_lsn')} bytes behind, {written} written")
        assert slot(pg)["wal_status"] == "reserved"

        insert(pg, "after-the-burst")
        sub.wait_for(lambda: "after-the-burst" in ids_of(sub), 30, "a relayed change after the burst")
        assert ids_of(sub) == ["warm", "after-the-burst"]
        relay.stop()
        assert relay.proc.returncode == 0, relay.errors()

        before = len(sub.lines())
        second = start_relay(pg, broker, workdir)
        wait_streaming(pg, second)
        insert(pg, "x1", "x2")
        sub.wait_for(lambda: "x2" in ids_of(sub), 30, "the changes after the restart")
        # In commit order: a repeat of x1 (or of anything before) would have come before x2.
        assert ids_of(sub)[before:] == ["x1", "x2"]
        assert "FULL RESYNC" not in relay.errors() + second.errors(), second.errors()
    finally:
        relay.stop()
        if second is not None:
            second.stop()
        sub.stop()


def test_a_slot_held_back_by_a_stalled_broker_is_said_to_be_behind_and_then_caught_up(pg, broker, workdir):
    """`--behind-mb 1`: the broker is stopped (SIGSTOP) with a relayed change in flight, so the relay confirms
    nothing while ~4 MB of WAL are written to a table it does not follow. The relay says in its log that it is
    behind (its slot's lag above the limit); once the broker runs again the change is delivered and the relay says
    it caught up."""
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir, "--behind-mb", "1", "--log-level", "notice")
    try:
        wait_streaming(pg, relay)
        insert(pg, "warm")
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the first event")
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            insert(pg, "held")
            with pg.connect() as db:
                for i in range(4):
                    db.execute("INSERT INTO other SELECT g, repeat(md5(g::text), 31) "
                               "FROM generate_series(%s::int, %s::int) g", (i * 1000, i * 1000 + 999))
            wait(relay, lambda: "behind: the slot is more WAL behind" in relay.errors(), 30,
                 "the relay saying it is behind")
            assert "lag_bytes" in relay.errors() and "caught up" not in relay.errors()
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        sub.wait_for(lambda: "held" in ids_of(sub), 60, "the held change once the broker runs again")
        wait(relay, lambda: "caught up with the server" in relay.errors(), 60, "the relay saying it caught up")
        relay.stop()
        assert relay.proc.returncode == 0, relay.errors()
    finally:
        relay.stop()
        sub.stop()


# ---------------------------------------------------------------- g. the walsender terminated mid-stream

def test_a_terminated_walsender_mid_stream_loses_no_change(pg, broker, workdir):
    """pg_terminate_backend of the slot's active_pid (the relay's walsender), four times while a writer commits
    rows: the relay reconnects each time and resumes from its checkpoint; every row arrives, the first deliveries
    in commit order, a repeat with the same key and seq."""
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir, "--max-changes", "50")
    written, stop, failure, writer = writer_of(pg, "n", pause=0.01)
    terminated = []
    try:
        wait(relay, lambda: slot(pg), 30, "the replication slot")
        pid = wait_streaming(pg, relay)
        writer.start()
        for _ in range(4):
            # Some changes relayed by this session first, then its walsender goes.
            seen = len(sub.lines())
            sub.wait_for(lambda: len(sub.lines()) >= seen + 20, 30, "changes relayed before the termination")
            assert query(pg, "SELECT pg_terminate_backend(%s)", pid) == [(True,)]
            terminated.append(pid)
            wait(relay, lambda: (slot(pg) or {}).get("active_pid") not in (None, *terminated), 60,
                 "the relay streaming again from a new walsender")
            pid = slot(pg)["active_pid"]
        seen = len(sub.lines())
        sub.wait_for(lambda: len(sub.lines()) >= seen + 20, 30, "changes relayed after the last termination")
        stop.set()
        writer.join(timeout=30)
        assert not writer.is_alive() and not failure, failure
        wait_for_ids(sub, written, 90, f"all {len(written)} rows")
        assert relay.proc.poll() is None, relay.errors()
        duplicates = check_at_least_once(events(sub), written, same=("key", "seq"), op="insert")
        print(f"{len(written)} rows, walsender terminated {len(terminated)} times; {duplicates} delivered twice")
    finally:
        stop.set()
        relay.stop()
        sub.stop()


# ---------------------------------------------------------------- the relay file: plugin and publication

def write_config(workdir, config):
    path = os.path.join(workdir, "relay.json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def test_relay_file_feeds_take_a_publication_and_the_plugin(workdir):
    """`pubsub relay run FILE`: a feed with "plugin": "pgoutput" and "publication" (made by the operator), and a
    feed with neither (the default pgoutput and its own publication)."""
    with PostgresCluster() as pg:
        make_tables(pg)
        with pg.connect() as db:
            db.execute("CREATE TABLE tasks (id int PRIMARY KEY, title text)")
            db.execute("CREATE PUBLICATION notes_feed FOR TABLE notes")
        with Broker(secret=SECRET) as broker:
            notes = start_subscriber(broker, "/changes/public/notes/*")
            tasks = start_subscriber(broker, "/changes/public/tasks/*")
            config = write_config(workdir, {"url": broker.url, "secret": SECRET, "feeds": [
                {"name": "notes", "source": "postgres", "dsn": pg.dsn, "slot": "relay_notes",
                 "table": ["public.notes"], "checkpoint": os.path.join(workdir, "notes.checkpoint"),
                 "plugin": "pgoutput", "publication": "notes_feed"},
                {"name": "tasks", "source": "postgres", "dsn": pg.dsn, "slot": "relay_tasks",
                 "table": ["public.tasks"], "checkpoint": os.path.join(workdir, "tasks.checkpoint")},
            ]})
            relay = Lines([pubsub_bin(), "relay", "run", config])
            try:
                wait(relay, lambda: slot(pg, "relay_notes") and slot(pg, "relay_tasks"), 30, "the two slots")
                assert (slot(pg, "relay_notes")["plugin"], slot(pg, "relay_tasks")["plugin"]) == ("pgoutput",
                                                                                                  "pgoutput")
                assert sorted(r[0] for r in query(pg, "SELECT pubname FROM pg_publication")) == [
                    "notes_feed", "pubsub_relay_tasks"]
                assert publication_tables(pg, "pubsub_relay_tasks") == ["public.tasks"]
                with pg.connect() as db:
                    db.execute("INSERT INTO notes (id, body) VALUES ('n1', 'x')")
                    db.execute("INSERT INTO tasks VALUES (7, 'build')")
                notes.wait_for(lambda: len(notes.lines()) >= 1, 30, "the note's event")
                tasks.wait_for(lambda: len(tasks.lines()) >= 1, 30, "the task's event")
                assert ids_of(notes) == ["n1"] and ids_of(tasks) == ["7"]
            finally:
                relay.stop()
                notes.stop()
                tasks.stop()
            assert relay.proc.returncode == 0, relay.errors()


@needs_wal2json()
def test_relay_file_feed_with_the_wal2json_plugin(workdir):
    with PostgresCluster(wal2json=True) as pg:
        make_tables(pg)
        with Broker(secret=SECRET) as broker:
            sub = start_subscriber(broker)
            config = write_config(workdir, {"url": broker.url, "secret": SECRET, "feeds": [
                {"name": "notes", "source": "postgres", "dsn": pg.dsn, "slot": SLOT, "table": ["public.notes"],
                 "checkpoint": os.path.join(workdir, "notes.checkpoint"), "plugin": "wal2json",
                 "poll_interval": 0.05}]})
            relay = Lines([pubsub_bin(), "relay", "run", config])
            try:
                wait(relay, lambda: slot(pg), 30, "the replication slot")
                assert slot(pg)["plugin"] == "wal2json"
                assert query(pg, "SELECT pubname FROM pg_publication") == []
                insert(pg, "w1")
                sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the event")
                assert ids_of(sub) == ["w1"]
            finally:
                relay.stop()
                sub.stop()
            assert relay.proc.returncode == 0, relay.errors()
