"""`pubsub relay couchdb|blip|simperium --route`: each document's changes reach the channels of its audience only,
against the fake servers (`relay-fake`) and a real broker.

Routes read fields of the document, so the relay reads documents without `--include-doc` (CouchDB
`include_docs=true`, Sync Gateway's `rev` messages, Simperium's `e:<id>.<v>`), and publishes no `doc`. Document feeds
give no old values: a move and a tombstone are routed by what the relay remembers in `<checkpoint>.audience`, which
a restarted relay reads again."""

import json
import os
import time
import urllib.parse
import urllib.request

import pytest

from pubsubtest.broker import pubsub_bin
from relaykit import (  # noqa: F401  (broker and workdir are fixtures)
    SECRET, Lines, events, start_fake, start_subscriber, broker, workdir)

SIMPERIUM_TOKEN = "relay-token"


def http(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"{}")


class CouchDB:
    """`relay-fake couchdb`: documents written with PUT, deleted with DELETE (a tombstone without fields) or with a
    PUT of `{"_deleted": true, …}` (a tombstone that keeps its fields)."""
    collection = "db"

    def __init__(self):
        self.proc, self.port = start_fake("couchdb", "--flavour", "opaque")
        self.revs = {}

    def relay_args(self):
        return ["couchdb", "--db-url", f"http://127.0.0.1:{self.port}/db", "--heartbeat", "500"]

    def path(self, doc_id):
        return "/db/" + urllib.parse.quote(doc_id, safe="")

    def put(self, doc_id, data):
        body = dict(data, _rev=self.revs[doc_id]) if doc_id in self.revs else data
        self.revs[doc_id] = http(self.port, "PUT", self.path(doc_id), body)["rev"]

    def delete(self, doc_id, keeping=None):
        if keeping is None:
            self.revs[doc_id] = http(self.port, "DELETE", self.path(doc_id) + "?rev=" + self.revs[doc_id])["rev"]
        else:
            self.put(doc_id, dict(keeping, _deleted=True))

    def stop(self):
        self.proc.stop()


class BLIP:
    """`relay-fake blip`: each revision's body is what its `rev` message carries; a tombstone has no fields unless
    it is written with some."""
    collection = "db"

    def __init__(self):
        self.proc, self.port = start_fake("blip", "--frame-size", "2048", "--compress")

    def relay_args(self):
        return ["blip", "--sg-url", f"ws://relay:pw@127.0.0.1:{self.port}/db"]

    def put(self, doc_id, data, deleted=False):
        query = urllib.parse.urlencode({"id": doc_id, **({"deleted": "1"} if deleted else {})})
        http(self.port, "POST", "/_fake/docs?" + query, data)

    def delete(self, doc_id, keeping=None):
        self.put(doc_id, keeping, deleted=True)

    def stop(self):
        self.proc.stop()


class Simperium:
    """`relay-fake simperium`, bucket `notes`: a delete carries no data at all."""
    collection = "notes"

    def __init__(self, user="relay@example.com"):
        self.proc, self.port = start_fake("simperium", "--app", "app1", "--token", f"{SIMPERIUM_TOKEN}={user}")

    def relay_args(self):
        return ["simperium", "--app-id", "app1", "--token", SIMPERIUM_TOKEN, "--bucket", "notes",
                "--simperium-url", f"ws://127.0.0.1:{self.port}"]

    def control(self, action, **body):
        http(self.port, "POST", f"/_fake/{action}", body)

    def put(self, doc_id, data):
        self.control("put", bucket="notes", id=doc_id, data=data)

    def delete(self, doc_id, keeping=None):
        assert keeping is None, "a Simperium delete has no data"
        self.control("delete", bucket="notes", id=doc_id)

    def stop(self):
        self.proc.stop()


SOURCES = {"couchdb": CouchDB, "blip": BLIP, "simperium": Simperium}


def routes_for(source):
    return [f"{source.collection}=/users/{{doc.owner}}/notes", f"{source.collection}=/users/{{doc.members[]}}/shared"]


def start_relay(source, broker, workdir, routes):
    cmd = [pubsub_bin(), "relay", *source.relay_args(), "--checkpoint", os.path.join(workdir, "checkpoint"),
           "--url", broker.url, "--secret", SECRET]
    for route in routes:
        cmd += ["--route", route]
    relay = Lines(cmd)
    if isinstance(source, Simperium):
        # The first run indexes the (empty) bucket first; what is written after it arrives as live changes.
        relay.wait_for(lambda: os.path.exists(os.path.join(workdir, "checkpoint")), 30, "the index")
    return relay


def stop_relay(relay):
    relay.stop()
    assert relay.proc.returncode == 0, relay.errors()


def summary(message):
    data = message["data"]
    return (message["channel"], data["op"], data["id"], data.get("audience"))


def wait_count(sub, count, what):
    sub.wait_for(lambda: len(sub.lines()) >= count, 30, what)


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_each_user_hears_of_their_documents_only_across_a_move_a_restart_and_a_delete(broker, workdir, kind):
    source = SOURCES[kind]()
    alice = start_subscriber(broker, "/users/a/**")
    bob = start_subscriber(broker, "/users/b/**")
    operator = start_subscriber(broker, "/users/**")
    relay = start_relay(source, broker, workdir, routes_for(source))
    try:
        source.put("n1", {"owner": "a", "body": "1"})
        wait_count(alice, 1, "the insert")
        source.put("n1", {"owner": "a", "body": "2"})
        wait_count(alice, 2, "the update")
        source.put("n1", {"owner": "b", "body": "3"})
        wait_count(alice, 3, "the move's left")
        wait_count(bob, 1, "the move's joined")
        source.put("n3", {"owner": "b", "body": "bob's"})
        wait_count(bob, 2, "bob's own document")
        source.put("s1", {"owner": "a", "members": ["a", "b"]})
        wait_count(alice, 5, "the shared document (alice)")
        wait_count(bob, 3, "the shared document (bob)")
        # A new relay process: it routes n1's tombstone by what it remembered of n1 (owner b), from the file.
        stop_relay(relay)
        assert os.path.exists(os.path.join(workdir, "checkpoint.audience"))
        relay = start_relay(source, broker, workdir, routes_for(source))
        source.delete("n1")
        wait_count(bob, 4, "the delete")
        source.put("z1", {"owner": "a"})
        source.put("z2", {"owner": "b"})
        wait_count(alice, 6, "alice's last document")
        wait_count(bob, 5, "bob's last document")
        wait_count(operator, 11, "everything, seen by the operator")
        time.sleep(0.5)
        got_a, got_b, everything = events(alice), events(bob), events(operator)
    finally:
        relay.stop()
        for sub in (alice, bob, operator):
            sub.stop()
        source.stop()
    assert relay.proc.returncode == 0, relay.errors()

    shared_a = {("/users/a/notes", "insert", "s1", None), ("/users/a/shared", "insert", "s1", None)}
    assert [summary(m) for m in got_a[:3]] == [
        ("/users/a/notes", "insert", "n1", None),
        ("/users/a/notes", "update", "n1", None),
        ("/users/a/notes", "update", "n1", "left"),
    ]
    assert {summary(m) for m in got_a[3:5]} == shared_a
    assert [summary(m) for m in got_a[5:]] == [("/users/a/notes", "insert", "z1", None)]
    assert [summary(m) for m in got_b] == [
        ("/users/b/notes", "update", "n1", "joined"),
        ("/users/b/notes", "insert", "n3", None),
        ("/users/b/shared", "insert", "s1", None),
        ("/users/b/notes", "delete", "n1", None),
        ("/users/b/notes", "insert", "z2", None),
    ]
    # Alice never hears of n1 after it left her, nor of Bob's own documents; Bob never heard of n1 before it joined
    # him, nor of Alice's own documents.
    left = next(i for i, m in enumerate(got_a) if m["data"].get("audience") == "left")
    assert all(m["data"]["id"] != "n1" for m in got_a[left + 1:])
    assert not {m["data"]["id"] for m in got_a} & {"n3", "z2"}
    assert not {m["data"]["id"] for m in got_b} & {"z1"}
    # The old audience is told first.
    order = [summary(m) for m in everything]
    assert order.index(("/users/a/notes", "update", "n1", "left")) < order.index(("/users/b/notes", "update", "n1", "joined"))
    # Routes read the documents, yet without --include-doc no message carries one.
    assert all("doc" not in m["data"] for m in everything)
    assert len({m["data"]["key"] for m in everything}) == len(everything) == 11
    assert all(m["data"]["collection"] == source.collection for m in everything)


@pytest.mark.parametrize("kind", ["couchdb", "blip"])
def test_a_tombstone_goes_by_the_remembered_values_else_by_its_own_fields_else_nowhere(broker, workdir, kind):
    source = SOURCES[kind]()
    carol = start_subscriber(broker, "/users/c/**")
    alice = start_subscriber(broker, "/users/a/**")
    zed = start_subscriber(broker, "/users/z/**")
    # Before the relay ever ran, so it remembers nothing of them: a tombstone that kept its fields and a bare one.
    source.put("kept", {"owner": "c"})
    source.delete("kept", keeping={"owner": "c"})
    source.put("bare", {"owner": "c"})
    source.delete("bare")
    relay = start_relay(source, broker, workdir, routes_for(source)[:1])
    try:
        wait_count(carol, 1, "the tombstone that kept its fields")
        source.put("moved", {"owner": "a"})
        wait_count(alice, 1, "the insert")
        # Deleted with other fields than it had: its audience is the one that had it.
        source.delete("moved", keeping={"owner": "z"})
        wait_count(alice, 2, "the delete")
        source.put("late", {"owner": "c"})
        wait_count(carol, 2, "a later document")
        time.sleep(0.5)
        got_c, got_a, got_z = events(carol), events(alice), events(zed)
        relay.wait_for(lambda: "no_previous" in relay.errors(), 10, "the unroutable bare tombstone logged")
    finally:
        relay.stop()
        for sub in (carol, alice, zed):
            sub.stop()
        source.stop()
    assert relay.proc.returncode == 0, relay.errors()
    assert [summary(m) for m in got_c] == [("/users/c/notes", "delete", "kept", None),
                                           ("/users/c/notes", "insert", "late", None)]
    assert [summary(m) for m in got_a] == [("/users/a/notes", "insert", "moved", None),
                                           ("/users/a/notes", "delete", "moved", None)]
    assert got_z == []


def test_simperium_user_route_puts_every_change_of_the_bucket_on_the_token_users_channel(broker, workdir):
    source = Simperium(user="a@b.c")
    source.put("x1", {"text": "indexed"})
    sub = start_subscriber(broker, "/users/a@b$2Ec/**")
    relay = start_relay(source, broker, workdir, ["notes=/users/{user}/notes"])
    try:
        wait_count(sub, 1, "the indexed entity")
        source.put("x2", {"text": "new"})
        source.put("x2", {"text": "changed"})
        source.delete("x1")
        source.delete("x2")
        wait_count(sub, 5, "every change")
        time.sleep(0.3)
        got = events(sub)
    finally:
        relay.stop()
        sub.stop()
        source.stop()
    assert relay.proc.returncode == 0, relay.errors()
    assert [summary(m) for m in got] == [
        ("/users/a@b$2Ec/notes", "update", "x1", None),
        ("/users/a@b$2Ec/notes", "insert", "x2", None),
        ("/users/a@b$2Ec/notes", "update", "x2", None),
        ("/users/a@b$2Ec/notes", "delete", "x1", None),
        ("/users/a@b$2Ec/notes", "delete", "x2", None),
    ]
    assert got[0]["data"]["resync"] is True


def distinct(sub):
    """The events of `sub`, each change once (a relay killed before its checkpoint sends its last batch again, with
    the same keys)."""
    seen, out = set(), []
    for message in events(sub):
        if message["data"]["key"] not in seen:
            seen.add(message["data"]["key"])
            out.append(message)
    return out


def test_the_remembered_values_survive_a_kill_9(broker, workdir):
    """The memory is a journal appended and fsynced with each acknowledged batch, before its checkpoint: a relay
    killed with SIGKILL (nothing written at exit) routes a later move and tombstone by what it remembered."""
    source = CouchDB()
    alice = start_subscriber(broker, "/users/a/**")
    bob = start_subscriber(broker, "/users/b/**")
    relay = start_relay(source, broker, workdir, routes_for(source)[:1])
    try:
        for i in range(50):
            source.put(f"d{i}", {"owner": "a"})
        alice.wait_for(lambda: len(distinct(alice)) >= 50, 30, "50 documents of alice")
        relay.kill9()
        assert os.path.exists(os.path.join(workdir, "checkpoint.audience"))
        relay = start_relay(source, broker, workdir, routes_for(source)[:1])
        source.put("d1", {"owner": "b"})
        source.delete("d2")
        alice.wait_for(lambda: len(distinct(alice)) >= 52, 30, "the move's left and the delete")
        wait_count(bob, 1, "the move's joined")
        time.sleep(0.5)
        got_a, got_b = distinct(alice), distinct(bob)
    finally:
        relay.stop()
        for sub in (alice, bob):
            sub.stop()
        source.stop()
    assert [summary(m) for m in got_a[50:]] == [("/users/a/notes", "update", "d1", "left"),
                                                ("/users/a/notes", "delete", "d2", None)]
    assert [summary(m) for m in got_b] == [("/users/b/notes", "update", "d1", "joined")]
    assert "no_previous" not in relay.errors()
