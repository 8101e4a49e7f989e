"""Runs each folder of Examples/ with its own run.sh, drives its page in Chromium, and takes a screenshot."""

import json
import os
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from pubsubtest.broker import REPO, pubsub_bin
from pubsubtest.ports import free_port
from pubsubtest.postgres import needs_postgres
from pubsubtest.process import stop_group
from pubsubtest.wait import wait_until

EXAMPLES = os.path.join(REPO, "Examples")
START_TIMEOUT = 60


class Example:
    """`Examples/<name>/run.sh` in its own process group, stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, name, ports, **env):
        self.name = name
        self.ports = ports
        self.output = []
        full_env = dict(os.environ, PUBSUB=pubsub_bin(), **{k: str(v) for k, v in env.items()})
        self.proc = subprocess.Popen([os.path.join(EXAMPLES, name, "run.sh")], env=full_env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        threading.Thread(target=self._drain, daemon=True).start()
        try:
            self._wait_ready()
        except Exception:
            self.stop()
            raise

    def _drain(self):
        for line in iter(self.proc.stdout.readline, b""):
            self.output.append(line.decode("utf-8", "replace"))

    def log(self):
        return "".join(self.output[-60:])

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        pending = list(self.ports)
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}/run.sh exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}/run.sh: ports {pending} not open in {START_TIMEOUT}s:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", pending[0]), timeout=0.5):
                    pending.pop(0)
            except OSError:
                time.sleep(0.1)

    def stop(self):
        stop_group(self.proc, timeout=20)


@pytest.fixture
def run_example():
    started = []

    def start(name, ports, **env):
        example = Example(name, ports, **env)
        started.append(example)
        return example

    yield start
    for example in started:
        example.stop()


def test_background_jobs(page, run_example, screenshot):
    port, broker_port = free_port(), free_port()
    example = run_example("background-jobs", [broker_port, port], PORT=port, BROKER_PORT=broker_port,
                          STEP_SECONDS="0.25")
    page.navigate(f"http://127.0.0.1:{port}/")
    page.wait_for("document.getElementById('status').textContent === 'connected'", what="the page connected")
    page.evaluate("document.getElementById('start').click()")
    page.wait_for("document.querySelector('.job.done .result') && "
                  "document.querySelector('.job.done .result').textContent", timeout=20,
                  what=f"the job to finish\n{example.log()}")
    result = page.evaluate("document.querySelector('.job.done .result').textContent")
    assert " orders, report at /reports/" in result
    assert page.evaluate("document.querySelector('.job.done .bar div').style.width") == "100%"

    page.evaluate("document.getElementById('spy').click()")
    refused = page.wait_for("document.querySelector('#spy-result.refused') && "
                            "document.querySelector('#spy-result.refused').textContent", what="the refusal")
    assert refused.endswith("Incorrect signature.")

    # A second job, caught half way, for the picture.
    page.evaluate("document.getElementById('start').click()")
    page.wait_for("document.querySelectorAll('.job').length === 2 && "
                  "parseInt(document.querySelector('.job .bar div').style.width) >= 40", timeout=20)
    screenshot(page, "example-background-jobs")


SYNC_ROWS = ("Array.prototype.map.call(document.querySelectorAll('#rows tr'), function (tr) {"
             " return [Number(tr.dataset.id), tr.children[1].textContent]; })")


def sync_database_url(example):
    prefix = "sync-notifications: database "
    line = next((line for line in example.output if line.startswith(prefix)), None)
    assert line, f"run.sh did not say which database it started\n{example.log()}"
    return line[len(prefix):].strip()


def notes_of(db, user):
    return [list(row) for row in db.execute("SELECT id, body FROM public.notes WHERE owner_id = %s ORDER BY id",
                                            (user,))]


def wait_mirrors(page, db, user, example, timeout=20):
    """Waits until the page's table equals the user's rows in the database, and returns them."""
    seen = {}

    def mirrored():
        seen["expected"], seen["shown"] = notes_of(db, user), page.evaluate(SYNC_ROWS)
        return seen["shown"] == seen["expected"]

    if not wait_until(mirrored, timeout, interval=0.1, raises=False):
        raise AssertionError(f"{user}'s page shows {seen['shown']}, the database has {seen['expected']}\n"
                             f"{page.dump()}\n{example.log()}")
    return seen["expected"]


def events_of(page):
    """The events that reached the page, twice: as its client's incoming extension recorded them (window.received),
    and as the browser received them in WebSocket frames (the DevTools protocol), /meta replies left out."""
    recorded = [(m["channel"], m["data"]) for m in page.evaluate("window.received")]
    framed = []
    for frame in page.network("Network.webSocketFrameReceived"):
        payload = json.loads(frame["response"]["payloadData"])
        for m in payload if isinstance(payload, list) else [payload]:
            if "data" in m and not m.get("channel", "").startswith("/meta/"):
                framed.append((m["channel"], m["data"]))
    return recorded, framed


def assert_only_own(page, user, never=()):
    """Every event that reached `user`'s page is on the user's own channel and shows only the user's rows: a "left"
    carries no row, anything else carries a row whose owner is the user; no id of `never` (rows that were never the
    user's) appears."""
    own = f"/users/{user}/notes"
    recorded, framed = events_of(page)
    assert recorded, f"{user}'s page received no event"
    assert recorded == framed, "the page's client saw other events than its WebSocket carried"
    for channel, data in recorded:
        assert channel == own, f"{user}'s page received an event of {channel}: {data}"
        assert data["collection"] == "public.notes" and data["op"] in ("insert", "update", "delete"), data
        assert data["id"] not in never, f"{user}'s page heard of row {data['id']}, which was never {user}'s: {data}"
        if data.get("audience") == "left":
            assert data["op"] == "update" and "doc" not in data, f"a row that left {user} shows its new values: {data}"
        else:
            assert data["doc"]["owner_id"] == user, f"{user}'s page received another owner's row: {data}"
    return [data for _, data in recorded]


@needs_postgres()
@pytest.mark.timeout(180)
def test_sync_notifications(browser, run_example, screenshot):
    """Two users' pages, each mirroring its own rows of public.notes through the relay's routes; a note moved
    between them; Bob's page closed while his notes change, and reopened."""
    import psycopg

    port, broker_port = free_port(), free_port()
    changes = 16
    example = run_example("sync-notifications", [broker_port, port], PORT=port, BROKER_PORT=broker_port,
                          EVERY="0.2", CHANGES=changes)
    db = psycopg.connect(sync_database_url(example), autocommit=True)
    pages = {}

    def open_page(user):
        page = pages[user] = browser.new_page()
        page.navigate(f"http://127.0.0.1:{port}/?user={user}")
        page.wait_for("document.body.dataset.ready === 'true'", what=f"{user}'s rows\n{example.log()}")
        return page

    def insert(owner, body):
        return db.execute("INSERT INTO public.notes (owner_id, body) VALUES (%s, %s) RETURNING id",
                          (owner, body)).fetchone()[0]

    def update(note, **values):
        sets = ", ".join(f"{column} = %s" for column in values)
        db.execute(f"UPDATE public.notes SET {sets}, updated_at = now() WHERE id = %s", (*values.values(), note))

    def ids(rows):
        return {note for note, _ in rows}

    try:
        alice, bob = open_page("alice"), open_page("bob")
        assert [p.evaluate("document.body.dataset.catchup") for p in (alice, bob)] == ["loaded", "loaded"]

        # run.sh's simulation (inserts, edits, deletes, notes moved between alice, bob and carol), both pages open.
        wait_until(lambda: f"simulate: done, {changes} changes" in example.log(), timeout=30,
                   message=f"the simulation to end\n{example.log()}")
        for user in ("alice", "bob"):
            wait_mirrors(pages[user], db, user, example)

        # A note moves from Alice to Bob: it leaves Alice's page and appears on Bob's.
        moved = insert("alice", "Hand over the keys")
        assert moved in ids(wait_mirrors(alice, db, "alice", example))
        update(moved, owner_id="bob", body="Hand over the keys (to bob)")
        assert moved not in ids(wait_mirrors(alice, db, "alice", example))
        assert moved in ids(wait_mirrors(bob, db, "bob", example))
        left = [d for d in assert_only_own(alice, "alice") if d["id"] == str(moved) and d.get("audience") == "left"]
        assert len(left) == 1 and left[0]["op"] == "update", left
        joined = [d for d in assert_only_own(bob, "bob") if d["id"] == str(moved) and d.get("audience") == "joined"]
        assert len(joined) == 1 and joined[0]["doc"]["body"] == "Hand over the keys (to bob)", joined

        # Bob's token grants /users/bob/** only: the broker refuses him Alice's channel and every wider pattern.
        for channel in ("/users/alice/notes", "/users/*/notes", "/users/**", "/**"):
            refused = bob.evaluate(f"client.subscribe({channel!r}, function () {{}}).then("
                                   "function () { return 'subscribed'; }, function (e) { return e.message; })",
                                   await_promise=True)
            assert refused == "No token grants this channel", (channel, refused)

        # Notes that are only ever Bob's, and one of Alice's and one of Bob's that will change hands.
        secret = insert("bob", "Plan Alice's surprise party")
        to_bob, to_alice = insert("alice", "Share the recipe"), insert("bob", "Lend the ladder")
        wait_mirrors(alice, db, "alice", example)
        wait_mirrors(bob, db, "bob", example)
        pages.pop("bob").close()

        # While Bob's page is closed: an insert, an edit, a delete, and a note moved each way.
        kettle = insert("bob", "Buy a new kettle")
        update(secret, body="Plan Alice's surprise party (cake ordered)")
        db.execute("DELETE FROM public.notes WHERE id = %s", (moved,))
        update(to_bob, owner_id="bob")
        update(to_alice, owner_id="alice")
        shown = ids(wait_mirrors(alice, db, "alice", example))
        assert to_alice in shown and to_bob not in shown

        # Reopened, the page shows the rows it saved and resumes from their position: the broker sends what it missed.
        bob = open_page("bob")
        assert bob.evaluate("document.body.dataset.catchup") == "resumed", example.log()
        assert int(bob.evaluate("document.body.dataset.missed")) >= 5
        rows = wait_mirrors(bob, db, "bob", example)
        assert {kettle, secret, to_bob} <= ids(rows) and not {moved, to_alice} & ids(rows)
        caught_up = {(d["id"], d.get("audience") or d["op"]) for d in assert_only_own(bob, "bob")}
        assert {(str(kettle), "insert"), (str(secret), "update"), (str(moved), "delete"), (str(to_bob), "joined"),
                (str(to_alice), "left")} <= caught_up, caught_up

        assert_only_own(alice, "alice", never={str(secret), str(kettle)})
        for user, page in pages.items():
            assert page.evaluate("document.getElementById('status').textContent") == "live"
            page.send("Page.bringToFront")  # a tab in the background is not painted
            screenshot(page, f"example-sync-notifications-{user}")
    finally:
        for page in pages.values():
            page.close()
        db.close()


def test_privatepub_migration(page, run_example, screenshot):
    port, broker_port = free_port(), free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        f.write(f'test:\n  server: "http://127.0.0.1:{broker_port}/faye"\n  secret_token: "s3cret"\n'
                f"  signature_expiration: 3600\n")
        config = f.name
    try:
        example = run_example("privatepub-migration", [broker_port, port], PORT=port, RAILS_ENV="test",
                              PRIVATE_PUB_CONFIG=config)
        page.navigate(f"http://127.0.0.1:{port}/")
        for channel in ("/messages/new", "/notices"):
            page.wait_for(f"!!PrivatePub.subscription('{channel}')", what=f"{channel}\n{example.log()}")
            outcome = page.evaluate(f"PrivatePub.subscription('{channel}').then(function () {{ return 'ok'; }},"
                                    " function (e) { return String(e); })", await_promise=True)
            assert outcome == "ok", outcome
        for text in ("Hello from the first browser", "PrivatePub pages work unchanged"):
            page.evaluate(f"var f = document.getElementById('new_message'); f.elements.body.value = {text!r};"
                          " f.requestSubmit();")
            page.wait_for(f"Array.prototype.some.call(document.querySelectorAll('#chat li'),"
                          f" function (li) {{ return li.textContent === {text!r}; }})", what=text)
        page.wait_for("document.getElementById('notices').textContent.indexOf('2 message(s)') === 0")
        screenshot(page, "example-privatepub-migration")
    finally:
        os.unlink(config)
