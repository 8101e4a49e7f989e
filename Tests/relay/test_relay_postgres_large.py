"""`pubsub relay postgres` on transactions larger than a batch: read, published and checkpointed in pieces, in bounded
memory, resumed inside the transaction after a kill -9; and the full resync read by key while rows come and go."""

import json
import os
import signal
import time

import psycopg
import pytest

from pubsubtest.broker import Broker, pubsub_bin
from pubsubtest.postgres import PostgresCluster, needs_postgres
from pubsubtest.process import status_kib
from relaykit import SECRET, Lines, events, start_subscriber, workdir  # noqa: F401  (workdir is a fixture)

pytestmark = needs_postgres()

# One UPDATE of every row, committed as one transaction, relayed in batches of BATCH changes (a debug build relays
# a few hundred changes per second on a loaded machine: CI time bounds LARGE).
LARGE, BATCH = 20_000, 1000
# The bound on the relay's memory above idle while it relays LARGE changes: holding them all at once, as the relay
# did before (about 2.3 KB per change), takes ~45 MB; the bound does not depend on LARGE (measured: ~5 MB).
MEMORY_BOUND_MB = 24


@pytest.fixture
def pg():
    with PostgresCluster() as cluster:
        with psycopg.connect(cluster.conninfo, autocommit=True) as db:
            db.execute("CREATE TABLE notes (id text PRIMARY KEY, body text, rev int NOT NULL DEFAULT 1)")
        yield cluster


@pytest.fixture
def broker():
    """A broker that lets the one subscriber queue a whole large transaction (the default slow-consumer limit would
    drop it during the burst: the broker protecting itself, not what is tested here)."""
    with Broker(secret=SECRET, extra_args=["--max-queue", "1000000"]) as b:
        yield b


def start_relay(pg, broker, workdir, *extra):
    return Lines([pubsub_bin(), "relay", "postgres", "--dsn", pg.dsn, "--slot", "relay_test",
                  "--table", "public.notes", "--checkpoint", os.path.join(workdir, "checkpoint"),
                  "--url", broker.url, "--secret", SECRET, "--poll-interval", "0.05", *extra])


def slot_exists(pg):
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        return db.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'relay_test'").fetchone()[0] == 1


def insert_rows(pg, count, prefix="n"):
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        db.execute("INSERT INTO notes (id, body) SELECT %s || lpad(g::text, 7, '0'), 'x' "
                   "FROM generate_series(0, %s - 1) g", (prefix, count))


def update_all_in_one_transaction(pg, prefix="n"):
    """One UPDATE of every row inserted by `insert_rows` with `prefix` (not of other rows: their changes would be in
    the transaction too)."""
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        db.execute("UPDATE notes SET rev = rev + 1 WHERE id LIKE %s", (prefix + "%",))


def index_of(data):
    """The change's index in its transaction (`data.seq` is `<commit end LSN>:<index>`)."""
    return int(data["seq"].rpartition(":")[2])


def checkpoint_position(workdir):
    with open(os.path.join(workdir, "checkpoint")) as f:
        return json.load(f)["position"]


def describe_repeats(messages, sub):
    """Which changes came more than once, where in the stream and with which positions, and the subscriber's log."""
    at = {}
    for i, m in enumerate(messages):
        at.setdefault(m["data"]["id"], []).append((i, (m.get("ext") or {}).get("position")))
    repeats = {k: v for k, v in at.items() if len(v) > 1}
    others = [(i, m) for i, m in enumerate(messages) if m["data"].get("op") != "update"]
    return (f"{len(messages)} events; repeated: {dict(list(repeats.items())[:10])}; not updates: {others[:5]}\n"
            f"subscriber:\n{sub.errors()[-3000:]}")


@pytest.mark.timeout(300)
def test_a_large_transaction_is_relayed_in_bounded_memory_once_and_in_order(pg, broker, workdir):
    insert_rows(pg, LARGE)  # before the slot exists: not relayed
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir, "--max-changes", str(BATCH))
    try:
        relay.wait_for(lambda: slot_exists(pg), 30, "the replication slot")
        # Idle: one small change relayed (every path taken once: read, publish, checkpoint, confirm).
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            db.execute("INSERT INTO notes (id, body) VALUES ('warm', 'x')")
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the first change")
        idle = status_kib(relay.proc.pid, "VmRSS")
        started = time.monotonic()
        update_all_in_one_transaction(pg)
        sub.wait_for(lambda: len(sub.lines()) >= LARGE + 1, 270, f"{LARGE} events")
        elapsed = time.monotonic() - started
        peak = status_kib(relay.proc.pid, "VmHWM")
        messages = events(sub)[1:]
        got = [m["data"] for m in messages]
        assert len(got) == LARGE, describe_repeats(messages, sub)
        assert len({d["id"] for d in got}) == LARGE and "warm" not in {d["id"] for d in got} and len({d["key"] for d in got}) == LARGE
        assert [index_of(d) for d in got] == list(range(1, LARGE + 1))
        assert len({d["txn"] for d in got}) == 1 and all(d["op"] == "update" for d in got)
        above = (peak - idle) / 1024
        print(f"{LARGE} changes in one transaction: {LARGE / elapsed:.0f} changes/s, relay peak RSS "
              f"{peak / 1024:.1f} MB, {above:.1f} MB above idle ({idle / 1024:.1f} MB)")
        assert above < MEMORY_BOUND_MB, f"relay memory grew by {above:.1f} MB for {LARGE} changes"
        # The transaction is whole: the checkpoint moves to its commit (it may be written just after the last
        # event reached the subscriber).
        relay.wait_for(lambda: ":" not in checkpoint_position(workdir), 30, "the checkpoint at the commit")
    finally:
        relay.stop()
        sub.stop()
    assert relay.proc.returncode == 0, relay.errors()


def test_kill_9_inside_a_large_transaction_resumes_after_the_last_acknowledged_change(pg, broker, workdir):
    total, batch = 20_000, 500
    insert_rows(pg, total)
    sub = start_subscriber(broker)
    # One publish request per batch: the broker under test crashes ("a request started in state closed") when a
    # publisher dies with several requests pipelined on one connection, which the relay's kill would cause.
    options = ("--max-changes", str(batch), "--batch-size", str(batch))
    relay = start_relay(pg, broker, workdir, *options)
    second = None
    try:
        relay.wait_for(lambda: slot_exists(pg), 30, "the replication slot")
        update_all_in_one_transaction(pg)
        sub.wait_for(lambda: len(sub.lines()) >= total // 3, 120, f"{total // 3} events before the kill")
        relay.kill9()
        # The checkpoint points inside the transaction: the changes acknowledged so far.
        position = checkpoint_position(workdir)
        assert ":" in position, position
        checkpointed = int(position.rpartition(":")[2])
        assert 0 < checkpointed < total
        before = len(sub.lines())
        second = start_relay(pg, broker, workdir, *options)
        try:
            sub.wait_for(lambda: len(sub.lines()) >= before + (total - checkpointed), 120, "the rest of the transaction")
        except AssertionError as e:
            raise AssertionError(f"{e}\nrelay:\n{second.errors()[-1500:]}\nbroker ({broker.returncode}):\n"
                                 f"{broker.log()[:6000]}") from None
        time.sleep(0.5)
        got = [m["data"] for m in events(sub)]
        # Every change at least once, the first deliveries in transaction order, nothing else.
        first, duplicates = {}, []
        for d in got:
            if index_of(d) in first:
                duplicates.append(d)
            else:
                first[index_of(d)] = d
        assert list(first) == list(range(1, total + 1))
        assert len({d["id"] for d in first.values()}) == total
        # A change sent twice is one that was in flight at the kill: after the checkpoint, at most one batch, and
        # with the same key and id.
        assert all((d["key"], d["id"]) == (first[index_of(d)]["key"], first[index_of(d)]["id"]) for d in duplicates)
        assert all(checkpointed < index_of(d) <= checkpointed + batch for d in duplicates), duplicates[:3]
        assert len(got) - total == len(duplicates) <= batch
        print(f"killed after {before} events, checkpoint {position}; {len(duplicates)} sent twice")
    finally:
        relay.stop()
        if second is not None:
            second.stop()
        sub.stop()


def test_a_full_resync_reads_by_key_while_rows_are_deleted_and_inserted(pg, broker, workdir):
    """The resync reads pages `WHERE key > last ORDER BY key`: rows deleted behind it or inserted meanwhile do not
    shift what comes next, so every row that existed throughout is sent (an OFFSET would skip as many rows as were
    deleted before it)."""
    total = 5000
    insert_rows(pg, total)  # before the slot exists
    sub = start_subscriber(broker)
    relay = start_relay(pg, broker, workdir)
    try:
        relay.wait_for(lambda: slot_exists(pg), 30, "the replication slot")
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            db.execute("INSERT INTO notes (id, body) VALUES ('n-first', 'x')")  # relayed: the checkpoint exists
        try:
            sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the first change")
        except AssertionError as e:
            raise AssertionError(f"{e}\nrelay:\n{relay.errors()[-3000:]}") from None
    except BaseException:
        sub.stop()  # the second part's `finally` is not reached
        raise
    finally:
        relay.stop()
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        db.execute("SELECT pg_drop_replication_slot('relay_test')")
    deleted = set()
    relay = start_relay(pg, broker, workdir, "--max-changes", "10")
    try:
        for round in range(3):
            sub.wait_for(lambda: sum(1 for m in events(sub) if m["data"].get("resync")) >= 10 * (round + 1), 60,
                         "a page of the resync")
            os.killpg(relay.proc.pid, signal.SIGSTOP)
            try:
                seen = sorted(m["data"]["id"] for m in events(sub) if m["data"].get("resync"))
                # Rows the resync already passed go, rows come before and after where it is.
                gone = [i for i in seen if i.startswith("n0") and i not in deleted][:20]
                with psycopg.connect(pg.conninfo, autocommit=True) as db:
                    db.execute("DELETE FROM notes WHERE id = ANY(%s)", (gone,))
                    db.execute("INSERT INTO notes (id, body) VALUES (%s, 'x'), (%s, 'x')",
                               (f"a-new-{round}", f"z-new-{round}"))
                deleted.update(gone)
            finally:
                os.killpg(relay.proc.pid, signal.SIGCONT)
        throughout = {f"n{g:07d}" for g in range(total)} - deleted
        sub.wait_for(lambda: {m["data"]["id"] for m in events(sub) if m["data"].get("resync")} >= throughout, 60,
                     "every row that existed throughout")
        assert len(deleted) >= 20
        assert "FULL RESYNC" in relay.errors()
    finally:
        relay.stop()
        sub.stop()
