"""`pubsub relay postgres --route`: each row's changes reach the channels of its audience only, on a real
PostgreSQL 15 (the relay's default plugin, pgoutput) and a real broker that takes JWTs only (the relay publishes
with `--token`).

Every client here speaks raw Bayeux over its own socket (WebSocket or long-polling) and keeps every message that
socket delivered, so "received nothing" means nothing reached the socket, not that a library filtered it."""

import itertools
import json
import os
import re
import subprocess
import threading
import time

import jwt
import psycopg
import pytest
import requests
import websocket

from pubsubtest.broker import Broker, pubsub_bin
from pubsubtest.postgres import PostgresCluster, needs_postgres
from pubsubtest.wait import wait_until
from relaykit import Lines, workdir  # noqa: F401  (workdir is a fixture)

JWT_KEY = "relay-routes-suite-hs256-key-0123456789abcdef"
SLOT = "relay_routes"
ROUTE = "public.notes=/users/{owner_id}/notes"
TRUNCATE_CHANNEL = "/changes/public/notes"
DATA_FIELDS = {"id", "op", "seq", "key", "collection", "source", "txn"}
NO_DOC = object()  # an expected message that must carry no `doc`

postgres = needs_postgres()


def token(sub, **claims):
    """An HS256 JWT for the suite's broker (claims as docs/AUTH.md names them: `channels`, `publish`)."""
    return jwt.encode({"sub": sub, "exp": int(time.time()) + 600, **claims}, JWT_KEY, algorithm="HS256")


# The relay may publish to the routes' channels and to the truncate's collection channel, nothing else.
RELAY_TOKEN_CLAIMS = {"publish": ["/users/**", TRUNCATE_CHANNEL]}


# ---------------------------------------------------------------- Bayeux sessions that keep what their socket got

class Session:
    """One Bayeux session over WebSocket or long-polling. `received` is every message its socket delivered, in
    order (replies included); `events()` the ones not on /meta. Requests (`subscribe`) are made before `start()`,
    which runs the connect loop in a thread until `stop()`."""

    HOLD_MS = {"websocket": 10000, "long-polling": 1000}

    def __init__(self, broker, transport, jwt_token=None):
        assert transport in ("websocket", "long-polling")
        self.broker = broker
        self.transport = transport
        self.received = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.failure = None
        self.thread = None
        self.numbers = itertools.count(1)
        self.http = requests.Session()
        self.ws = websocket.create_connection(broker.ws_url, timeout=10) if transport == "websocket" else None
        handshake = {"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": [transport]}
        if jwt_token:
            handshake["ext"] = {"token": jwt_token}
        self.handshake = self.call(handshake)
        assert self.handshake["successful"] is True, self.handshake
        self.client_id = self.handshake["clientId"]

    def _keep(self, messages):
        with self.lock:
            self.received.extend(messages)

    def _post(self, messages, timeout=10):
        r = self.http.post(self.broker.url, data=json.dumps(messages), timeout=timeout,
                           headers={"Content-Type": "application/json"})
        assert r.status_code == 200, (r.status_code, r.text[:300])
        replies = r.json()
        self._keep(replies)
        return replies

    def call(self, message):
        """Sends one request (not a connect) and returns its reply; only before start() or after stop()."""
        message = dict(message, id=f"r{next(self.numbers)}")
        if self.ws is None:
            replies = self._post([message])
        else:
            self.ws.send(json.dumps([message]))
            replies = []
            deadline = time.monotonic() + 10
            while not any(m.get("id") == message["id"] for m in replies):
                assert time.monotonic() < deadline, f"no reply to {message} over WebSocket"
                frame = self.ws.recv()
                if frame:
                    got = json.loads(frame)
                    self._keep(got)
                    replies.extend(got)
        return next(m for m in replies if m.get("id") == message["id"])

    def subscribe(self, channel, ext=None):
        message = {"channel": "/meta/subscribe", "clientId": self.client_id, "subscription": channel}
        if ext:
            message["ext"] = ext
        return self.call(message)

    def _connect_message(self):
        return {"channel": "/meta/connect", "clientId": self.client_id, "connectionType": self.transport,
                "advice": {"timeout": self.HOLD_MS[self.transport]}, "id": f"c{next(self.numbers)}"}

    def _poll(self):
        while not self.stopping.is_set():
            try:
                replies = self._post([self._connect_message()], timeout=15)
            except Exception as e:  # reported by the test
                self.failure = e
                return
            connect = [m for m in replies if m.get("channel") == "/meta/connect"]
            if not connect or connect[0].get("successful") is not True:
                self.failure = connect
                return

    def _read(self):
        self.ws.send(json.dumps([self._connect_message()]))
        self.ws.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                frame = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            except Exception as e:
                if not self.stopping.is_set():
                    self.failure = e
                return
            if not frame:
                continue
            messages = json.loads(frame)
            self._keep(messages)
            for m in messages:
                if m.get("channel") == "/meta/connect":
                    if m.get("successful") is not True:
                        self.failure = m
                        return
                    self.ws.send(json.dumps([self._connect_message()]))

    def start(self):
        self.thread = threading.Thread(target=self._read if self.ws else self._poll, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=15)
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass

    def events(self):
        with self.lock:
            return [m for m in self.received if not m.get("channel", "").startswith("/meta/")]

    def everything(self):
        with self.lock:
            return list(self.received)

    def __repr__(self):
        return f"<{self.transport} session {self.client_id}>"


def wait_events(session, count, what, timeout=30):
    wait_until(lambda: len(session.events()) >= count or session.failure, timeout, message=f"{what} ({session})")
    assert session.failure is None, f"{session}: {session.failure}"


def stop_all(*sessions):
    for s in sessions:
        s.stop()
    for s in sessions:
        assert s.failure is None, f"{s}: {s.failure}"


def summary(message):
    """(channel, id, op, audience) of a delivered change."""
    d = message["data"]
    return message["channel"], d["id"], d["op"], d.get("audience")


def check_change(message, channel, id, op, audience, doc):
    """One delivered change: its channel, its data's fields (exactly the interface's), its audience and doc."""
    assert message["channel"] == channel, message
    d = message["data"]
    assert (d["id"], d["op"], d.get("audience")) == (id, op, audience), message
    expected = set(DATA_FIELDS)
    if audience is not None:
        expected.add("audience")
    if doc is not NO_DOC:
        expected.add("doc")
        assert d["doc"] == doc, message
    assert set(d) == expected, message
    assert d["collection"] == "public.notes" and d["source"] == f"pg:{SLOT}", message
    assert re.fullmatch(r"[0-9a-f]{32}", d["key"]), message
    assert isinstance(message.get("ext", {}).get("position"), str), message


# ---------------------------------------------------------------- channel segments as docs/RELAY.md escapes them

KEPT = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!~()@")


def unescape(segment):
    if segment == "$":
        return ""
    out, i = bytearray(), 0
    while i < len(segment):
        if segment[i] == "$":
            out.append(int(segment[i + 1:i + 3], 16))
            i += 3
        else:
            assert ord(segment[i]) in KEPT, segment
            out.append(ord(segment[i]))
            i += 1
    return out.decode("utf-8")


# ---------------------------------------------------------------- PostgreSQL, the broker, the relay

@pytest.fixture(scope="module")
def pg_cluster():
    """One PostgreSQL for the module (initdb is the slow part); each test gets a fresh table and slot."""
    with PostgresCluster() as cluster:
        yield cluster


def drop_slots(pg):
    """The slots, and the publication the relay made for its slot (pgoutput): the table is made again for each
    test, and a publication keeps only the tables that existed when it was made."""
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        db.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active")
        db.execute(f"DROP PUBLICATION IF EXISTS pubsub_{SLOT}")


@pytest.fixture
def pg(pg_cluster):
    """`public.notes (id, owner_id, body)` with REPLICA IDENTITY FULL, as routes need; no slot yet."""
    drop_slots(pg_cluster)
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as db:
        db.execute("DROP TABLE IF EXISTS notes")
        db.execute("CREATE TABLE notes (id text PRIMARY KEY, owner_id text, body text)")
        db.execute("ALTER TABLE notes REPLICA IDENTITY FULL")
    yield pg_cluster
    drop_slots(pg_cluster)


def sql(pg, *statements):
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        for statement in statements:
            if isinstance(statement, tuple):
                db.execute(*statement)
            else:
                db.execute(statement)


def sql_count(pg, query):
    with psycopg.connect(pg.conninfo, autocommit=True) as db:
        return db.execute(query).fetchone()[0]


@pytest.fixture
def jwt_broker():
    """A broker that takes JWTs only: no secret, so an unsigned publish or subscribe is refused."""
    with Broker(timeout=10, extra_args=["--jwt-key", JWT_KEY, "--log-level", "warning"]) as b:
        yield b


def relay_command(pg, broker, workdir, *extra, routes=(ROUTE,), relay_token="default"):
    cmd = [pubsub_bin(), "relay", "postgres", "--dsn", pg.dsn, "--slot", SLOT, "--table", "public.notes",
           "--checkpoint", os.path.join(workdir, "checkpoint"), "--url", broker.url, "--poll-interval", "0.05",
           "--include-doc"]
    for route in routes:
        cmd += ["--route", route]
    if relay_token == "default":
        relay_token = token("relay", **RELAY_TOKEN_CLAIMS)
    if relay_token is not None:
        cmd += ["--token", relay_token]
    return cmd + list(extra)


def start_relay(pg, broker, workdir, *extra, **kwargs):
    """The routed relay, once its slot exists (a slot sees only changes made after it was created)."""
    relay = Lines(relay_command(pg, broker, workdir, *extra, **kwargs))

    def slot_exists():
        with psycopg.connect(pg.conninfo, autocommit=True) as db:
            return db.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                              (SLOT,)).fetchone()[0] == 1
    try:
        relay.wait_for(slot_exists, 30, "the replication slot")
    except AssertionError:
        relay.stop()
        raise
    return relay


def operator(broker, transport="websocket"):
    """An operator's session on `/**`: it sees every channel the relay publishes to."""
    s = Session(broker, transport, token("ops", channels=["/**"]))
    reply = s.subscribe("/**")
    assert reply["successful"] is True, reply
    return s.start()


def user_session(broker, transport, user):
    s = Session(broker, transport, token(user, channels=[f"/users/{user}/**"]))
    reply = s.subscribe(f"/users/{user}/notes")
    assert reply["successful"] is True, reply
    return s


def unrouted_log_lines(relay):
    """The relay's log lines about a route that gave a change no channel because a value is NULL."""
    return [line for line in relay.errors().splitlines()
            if re.search(r"null", line, re.I) and re.search(r"route", line, re.I)]


# ---------------------------------------------------------------- 1. each user sees their rows, and only theirs

@postgres
def test_each_user_gets_exactly_their_rows_on_both_transports_and_nobody_else_does(pg, jwt_broker, workdir):
    b = jwt_broker
    users = {u: [user_session(b, t, u) for t in ("websocket", "long-polling")] for u in "AB"}
    # C has a valid token but no grant: every subscribe that could reach A's or B's rows is refused.
    outsiders = [Session(b, t, token("C")) for t in ("websocket", "long-polling")]
    for s in outsiders:
        for channel in ["/users/A/notes", "/users/B/notes", "/users/*/notes", "/users/**", TRUNCATE_CHANNEL]:
            reply = s.subscribe(channel)
            assert reply["successful"] is False, reply
            assert reply["error"] == f"403:{channel}:No token grants this channel", reply
    ops = operator(b)
    sessions = [s for pair in users.values() for s in pair] + outsiders
    for s in sessions:
        s.start()
    relay = start_relay(pg, b, workdir)
    try:
        sql(pg,
            "INSERT INTO notes VALUES ('a1', 'A', 'a1 A-only v1')",
            "INSERT INTO notes VALUES ('b1', 'B', 'b1 B-only v1')",
            "INSERT INTO notes VALUES ('a2', 'A', 'a2 A-only v1')")
        with psycopg.connect(pg.conninfo) as db:  # one transaction touching both users
            db.execute("INSERT INTO notes VALUES ('a3', 'A', 'a3 A-only')")
            db.execute("INSERT INTO notes VALUES ('b2', 'B', 'b2 B-only')")
        sql(pg,
            "UPDATE notes SET body = 'a1 A-only v2' WHERE id = 'a1'",
            "UPDATE notes SET body = 'b1 B-only v2' WHERE id = 'b1'",
            "UPDATE notes SET owner_id = 'B', body = 'a2 B-only at B' WHERE id = 'a2'",   # A -> B
            "UPDATE notes SET owner_id = 'A', body = 'a2 A-only back' WHERE id = 'a2'",   # B -> A
            "DELETE FROM notes WHERE id = 'b1'",
            "DELETE FROM notes WHERE id = 'a3'",
            "INSERT INTO notes VALUES ('n1', NULL, 'n1 nobody')",                          # no audience
            "UPDATE notes SET body = 'n1 nobody v2' WHERE id = 'n1'",
            "DELETE FROM notes WHERE id = 'n1'",
            "INSERT INTO notes VALUES ('a4', 'A', 'a4 A-only')",
            "UPDATE notes SET owner_id = NULL WHERE id = 'a4'",                              # A -> nobody
            "UPDATE notes SET owner_id = 'A', body = 'a4 A-only again' WHERE id = 'a4'",     # nobody -> A
            "TRUNCATE notes")

        def row(id, owner, body):
            return {"id": id, "owner_id": owner, "body": body}

        expected = {
            "A": [("a1", "insert", None, row("a1", "A", "a1 A-only v1")),
                  ("a2", "insert", None, row("a2", "A", "a2 A-only v1")),
                  ("a3", "insert", None, row("a3", "A", "a3 A-only")),
                  ("a1", "update", None, row("a1", "A", "a1 A-only v2")),
                  ("a2", "update", "left", NO_DOC),
                  ("a2", "update", "joined", row("a2", "A", "a2 A-only back")),
                  ("a3", "delete", None, row("a3", "A", "a3 A-only")),
                  ("a4", "insert", None, row("a4", "A", "a4 A-only")),
                  ("a4", "update", "left", NO_DOC),
                  ("a4", "update", "joined", row("a4", "A", "a4 A-only again"))],
            "B": [("b1", "insert", None, row("b1", "B", "b1 B-only v1")),
                  ("b2", "insert", None, row("b2", "B", "b2 B-only")),
                  ("b1", "update", None, row("b1", "B", "b1 B-only v2")),
                  ("a2", "update", "joined", row("a2", "B", "a2 B-only at B")),
                  ("a2", "update", "left", NO_DOC),
                  ("b1", "delete", None, row("b1", "B", "b1 B-only v2"))],
        }
        ONLY = {"A": {"a1", "a3", "a4"}, "B": {"b1", "b2"}}  # rows that never belonged to the other user
        total = len(expected["A"]) + len(expected["B"]) + 1
        try:
            wait_events(ops, total, f"{total} messages on /**")
            for user, pair in users.items():
                for s in pair:
                    wait_events(s, len(expected[user]), f"{user}'s {len(expected[user])} messages")
        except AssertionError as e:
            raise AssertionError(f"{e}\nrelay:\n{relay.errors()[-3000:]}") from None
        time.sleep(1.5)  # anything extra would arrive now (a long-poll holds 1 s)
    finally:
        relay.stop()
        stop_all(ops, *sessions)
    assert relay.proc.returncode == 0, relay.errors()

    for user, pair in users.items():
        other = "B" if user == "A" else "A"
        for s in pair:
            got = s.events()
            assert [summary(m)[1:] for m in got] == [e[:3] for e in expected[user]], (user, s, got)
            for message, (id, op, audience, doc) in zip(got, expected[user]):
                check_change(message, f"/users/{user}/notes", id, op, audience, doc)
            # Nothing about the other user's rows: no id of theirs, no value they wrote, not even in a `left`.
            assert not {m["data"]["id"] for m in got} & ONLY[other], got
            assert f"{other}-only" not in json.dumps(got), got
            assert all(m["data"].get("doc", {}).get("owner_id", user) == user for m in got), got
        # The user's two transports got the same messages, each with the same position.
        ws, lp = (s.events() for s in pair)
        assert [(m["channel"], m["data"], m["ext"]["position"]) for m in ws] == \
               [(m["channel"], m["data"], m["ext"]["position"]) for m in lp]

    # The move's two messages are one change (one seq) with a key of their own on each channel.
    a_left, b_joined = users["A"][0].events()[4]["data"], users["B"][0].events()[3]["data"]
    assert a_left["seq"] == b_joined["seq"] and a_left["txn"] == b_joined["txn"] and a_left["key"] != b_joined["key"]
    b_left, a_joined = users["B"][0].events()[4]["data"], users["A"][0].events()[5]["data"]
    assert b_left["seq"] == a_joined["seq"] and b_left["key"] != a_joined["key"]

    # C's sockets delivered no event at all, only the replies to its own requests.
    for s in outsiders:
        assert s.events() == [], s.events()
        assert all(m.get("channel", "").startswith("/meta/") and "data" not in m for m in s.everything())

    # The operator saw every message, the truncate on the collection channel only, and nothing for the NULL row.
    seen = ops.events()
    assert len(seen) == total, [summary(m) for m in seen]
    assert sorted(summary(m) for m in seen[:-1]) == sorted(
        [(f"/users/{u}/notes", id, op, audience) for u in "AB" for id, op, audience, _ in expected[u]])
    assert summary(seen[-1]) == (TRUNCATE_CHANNEL, None, "truncate", None)
    assert not any(m["data"]["id"] == "n1" for m in seen)
    assert {m["channel"] for m in seen} == {"/users/A/notes", "/users/B/notes", TRUNCATE_CHANNEL}
    assert len({m["data"]["key"] for m in seen}) == total

    # The changes that had no owner (n1's three, a4's while it had none) were said once in the log, not per row.
    lines = unrouted_log_lines(relay)
    assert len(lines) == 1, relay.errors()
    assert "public.notes" in lines[0] or "/users/{owner_id}/notes" in lines[0], lines


@postgres
def test_null_owner_rows_are_counted_in_the_broker_metrics(pg, workdir):
    """The standalone relay has no /metrics; inside `pubsub serve --relay FILE` its counters are the broker's."""
    config = os.path.join(workdir, "relay.json")
    with open(config, "w") as f:
        json.dump({"feeds": [{
            "name": "notes", "source": "postgres", "dsn": pg.dsn, "slot": SLOT, "table": ["public.notes"],
            "checkpoint": os.path.join(workdir, "checkpoint"), "route": [ROUTE], "include_doc": True,
            "poll_interval": 0.05}]}, f)
    with Broker(timeout=10, extra_args=["--jwt-key", JWT_KEY, "--relay", config]) as b:
        alice = user_session(b, "long-polling", "A").start()
        try:
            wait_until(lambda: sql_count(pg, f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{SLOT}'"),
                       30, message=f"the replication slot\n{b.log()[-2000:]}")
            sql(pg,
                "INSERT INTO notes VALUES ('n1', NULL, 'nobody')",
                "UPDATE notes SET body = 'nobody v2' WHERE id = 'n1'",
                "DELETE FROM notes WHERE id = 'n1'",
                "INSERT INTO notes VALUES ('a1', 'A', 'mine')")
            try:
                wait_events(alice, 1, "A's insert")
            except AssertionError as e:
                raise AssertionError(f"{e}\nbroker:\n{b.log()[-3000:]}") from None
            time.sleep(1.5)
        finally:
            stop_all(alice)
        assert [summary(m) for m in alice.events()] == [("/users/A/notes", "a1", "insert", None)]
        text = requests.get(f"http://127.0.0.1:{b.port}/metrics", timeout=5).text
        counted = [line for line in text.splitlines()
                   if line.startswith("pubsub_relay_unrouted_total{") and 'reason="null"' in line]
        assert len(counted) == 1, [line for line in text.splitlines() if "unrouted" in line]
        assert 'collection="public.notes"' in counted[0], counted
        assert float(counted[0].rsplit(" ", 1)[1]) == 3, counted
        log_lines = [line for line in b.log().splitlines()
                     if re.search(r"null", line, re.I) and re.search(r"route", line, re.I)]
        assert len(log_lines) == 1, b.log()[-3000:]


# ---------------------------------------------------------------- 2. hostile values stay one escaped segment

HOSTILE = [  # (id, owner_id, the only channel it may reach)
    ("h1", "*", "/users/$2A/notes"),
    ("h2", "**", "/users/$2A$2A/notes"),
    ("h3", "../x", "/users/$2E$2E$2Fx/notes"),
    ("h4", "/admin", "/users/$2Fadmin/notes"),
    ("h5", "meta", "/users/meta/notes"),
    ("h6", "", "/users/$/notes"),
    ("h7", "$", "/users/$24/notes"),
    ("h8", "é/../*", "/users/$C3$A9$2F$2E$2E$2F$2A/notes"),
]


@postgres
def test_hostile_owner_values_land_on_exactly_their_escaped_channel(pg, jwt_broker, workdir, monkeypatch):
    b = jwt_broker
    ops = operator(b)
    exact = Session(b, "long-polling", token("svc", channels=["/users/**"]))
    for _, _, channel in HOSTILE:
        reply = exact.subscribe(channel)
        assert reply["successful"] is True, reply
    exact.start()
    wildcard = Session(b, "websocket", token("svc", channels=["/users/**"]))
    assert wildcard.subscribe("/users/**")["successful"] is True  # (Bayeux wildcards end a pattern)
    wildcard.start()
    # The relay's token from the environment this time.
    monkeypatch.setenv("PUBSUB_TOKEN", token("relay", **RELAY_TOKEN_CLAIMS))
    relay = start_relay(pg, b, workdir, relay_token=None)
    try:
        for id, owner, _ in HOSTILE:
            sql(pg, ("INSERT INTO notes VALUES (%s, %s, 'x')", (id, owner)))
        try:
            for s in (ops, exact, wildcard):
                wait_events(s, len(HOSTILE), f"{len(HOSTILE)} messages")
        except AssertionError as e:
            raise AssertionError(f"{e}\nrelay:\n{relay.errors()[-3000:]}") from None
        time.sleep(1.5)
    finally:
        relay.stop()
        stop_all(ops, exact, wildcard)
    assert relay.proc.returncode == 0, relay.errors()

    wanted = [(channel, id, "insert", None) for id, _, channel in HOSTILE]
    for s in (ops, exact, wildcard):
        assert [summary(m) for m in s.events()] == wanted, (s, [summary(m) for m in s.events()])
    for m, (id, owner, channel) in zip(ops.events(), HOSTILE):
        assert m["data"]["doc"]["owner_id"] == owner
        assert unescape(channel.split("/")[2]) == owner  # reversible
    # The operator's socket carried the replies to its own requests and these eight messages: no other channel,
    # and nothing published on a /meta channel.
    for m in ops.everything():
        if m.get("channel", "").startswith("/meta/"):
            assert "data" not in m and "successful" in m, m
        else:
            assert m["channel"] in {channel for _, _, channel in HOSTILE}, m


# ---------------------------------------------------------------- 3. a routed table needs its columns in the identity

@postgres
def test_a_routed_table_without_replica_identity_full_is_refused_at_start(pg, jwt_broker, workdir):
    b = jwt_broker
    sql(pg, "ALTER TABLE notes REPLICA IDENTITY DEFAULT", "ALTER TABLE notes ADD COLUMN team_id text")

    def refused(routes):
        started = time.monotonic()
        run = subprocess.run(relay_command(pg, b, workdir, routes=routes), capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)
        assert run.returncode == 64, (run.returncode, run.stderr)
        assert time.monotonic() - started < 20
        assert "Traceback" not in run.stderr and "Fatal error" not in run.stderr, run.stderr
        lines = [line for line in run.stderr.splitlines() if "REPLICA IDENTITY" in line.upper()]
        assert len(lines) == 1, run.stderr
        return lines[0], run.stderr

    line, stderr = refused([ROUTE])
    assert "public.notes" in line and "owner_id" in line, stderr
    fix = re.search(r"ALTER TABLE [^;]*?REPLICA IDENTITY FULL", line)
    assert fix, stderr
    # Two routes, two columns missing: both named in the one line.
    line, stderr = refused([ROUTE, "public.notes=/teams/{team_id}/notes"])
    assert "public.notes" in line and "owner_id" in line and "team_id" in line, stderr
    assert re.search(r"ALTER TABLE [^;]*?REPLICA IDENTITY FULL", line), stderr
    drop_slots(pg)

    # The fix the line gives works as written: then the relay starts and routes.
    sql(pg, fix.group(0))
    ops = operator(b)
    relay = start_relay(pg, b, workdir)
    try:
        sql(pg, "INSERT INTO notes (id, owner_id, body) VALUES ('a1', 'A', 'x')")
        wait_events(ops, 1, "the insert")
    finally:
        relay.stop()
        stop_all(ops)
    assert [summary(m) for m in ops.events()] == [("/users/A/notes", "a1", "insert", None)]


# ---------------------------------------------------------------- 4. resuming a routed channel from a position

@postgres
def test_a_client_resumes_its_routed_channel_from_its_last_position(pg, workdir):
    with Broker(timeout=10, extra_args=["--jwt-key", JWT_KEY, "--history-size", "20"]) as b:
        ops = operator(b)
        first = user_session(b, "long-polling", "A").start()
        relay = start_relay(pg, b, workdir)
        sessions = [ops, first]
        try:
            sql(pg, "INSERT INTO notes VALUES ('a1', 'A', 'v1')")
            wait_events(first, 1, "the first insert")
            kept = first.events()[-1]["ext"]["position"]
            first.stop()
            assert first.call({"channel": "/meta/disconnect", "clientId": first.client_id})["successful"] is True

            # While A is away: three changes on A's channel (one of them a row leaving it), three on B's.
            sql(pg,
                "INSERT INTO notes VALUES ('a2', 'A', 'v1')",
                "INSERT INTO notes VALUES ('b1', 'B', 'v1')",
                "UPDATE notes SET body = 'v2' WHERE id = 'a1'",
                "UPDATE notes SET owner_id = 'B' WHERE id = 'a2'",
                "UPDATE notes SET body = 'v2' WHERE id = 'b1'")
            wait_events(ops, 7, "7 messages on /**")
            missed = [m for m in ops.events() if m["channel"] == "/users/A/notes"][1:]
            assert [summary(m)[1:] for m in missed] == [
                ("a2", "insert", None), ("a1", "update", None), ("a2", "update", "left")]

            second = Session(b, "websocket", token("A", channels=["/users/A/**"]))
            sessions.append(second)
            reply = second.subscribe("/users/A/notes", ext={"resume": kept})
            assert reply["successful"] is True, reply
            assert reply["ext"]["resume"] == {"recovered": True, "missed": 3}, reply
            second.start()
            wait_events(second, 3, "the missed messages")
            sql(pg, "INSERT INTO notes VALUES ('a3', 'A', 'live')")
            wait_events(second, 4, "a live message after them")
            time.sleep(0.5)
            got = second.events()
            assert [(m["data"], m["ext"]["position"]) for m in got[:3]] == \
                   [(m["data"], m["ext"]["position"]) for m in missed]
            assert [summary(m) for m in got[3:]] == [("/users/A/notes", "a3", "insert", None)]
            last = got[-1]["ext"]["position"]
            second.stop()

            # Away again, while more than the history holds is published (B's rows count too): not recovered.
            sql(pg, ("INSERT INTO notes SELECT 'b' || i, 'B', 'bulk' FROM generate_series(10, 34) AS i",),
                "INSERT INTO notes VALUES ('a4', 'A', 'while away')")
            wait_events(ops, 7 + 1 + 26, "the bulk on /**")
            third = Session(b, "long-polling", token("A", channels=["/users/A/**"]))
            sessions.append(third)
            reply = third.subscribe("/users/A/notes", ext={"resume": last})
            assert reply["successful"] is True, reply
            assert reply["ext"]["resume"]["recovered"] is False, reply
            third.start()
            sql(pg, "INSERT INTO notes VALUES ('a5', 'A', 'after')")
            wait_until(lambda: any(m["data"]["id"] == "a5" for m in third.events()), 30, message="a live message")
            assert all(m["channel"] == "/users/A/notes" for m in third.events()), third.events()
        finally:
            relay.stop()
            stop_all(*sessions)


# ---------------------------------------------------------------- 5. bad --route arguments

@pytest.mark.parametrize("route", [
    "nonsense",
    "public.notes=/{owner_id}/x",
    "public.notes=/users/*/x",
    "public.notes=/meta/{owner_id}",
])
def test_a_bad_route_is_refused_with_one_line(workdir, route):
    started = time.monotonic()
    # The database cannot be reached: a route refused before connecting exits 64, not 69.
    run = subprocess.run(
        [pubsub_bin(), "relay", "postgres", "--dsn", "postgres://postgres@127.0.0.1:1/postgres", "--slot", SLOT,
         "--table", "public.notes", "--checkpoint", os.path.join(workdir, "c"), "--url", "http://127.0.0.1:9/faye",
         "--route", route], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert run.returncode == 64, (run.returncode, run.stderr)
    assert time.monotonic() - started < 10
    assert run.stdout == ""
    errors = [line for line in run.stderr.splitlines() if line.startswith("Error:") or "route" in line.lower()
              and "usage" not in line.lower() and "--route <" not in line]
    assert len(errors) == 1, run.stderr
    assert route in errors[0], run.stderr
    assert not os.path.exists(os.path.join(workdir, "c"))
