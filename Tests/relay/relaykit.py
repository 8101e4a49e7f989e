"""Processes and subscribers shared by the relay suites: the broker, `pubsub subscribe`, the relay, the fakes."""

import json
import os
import tempfile

import pytest

from pubsubtest.broker import Broker, pubsub_bin
from pubsubtest.process import Lines  # noqa: F401  (re-exported for the test modules)

SECRET = "relay-secret"


def start_subscriber(broker, pattern="/changes/public/notes/*"):
    """`pubsub subscribe --full` on `pattern`, once subscribed; its stdout lines are the events."""
    sub = Lines([pubsub_bin(), "subscribe", "--url", broker.url, "--secret", SECRET, "--full", pattern])
    sub.wait_for(lambda: "subscribed to" in sub.errors(), 30, "the subscription")
    return sub


def events(sub):
    return [json.loads(line) for line in sub.lines()]


def seen_ids(sub):
    """The document ids of the events `sub` received so far."""
    return {json.loads(line)["data"]["id"] for line in sub.lines()}


def wait_for_ids(sub, ids, timeout, what):
    """Waits until `sub` received an event for each of `ids`."""
    wanted = set(ids)
    sub.wait_for(lambda: seen_ids(sub) >= wanted, timeout, what)


def check_at_least_once(got, ids, same=("key",), op=None, ordered=True):
    """Checks what a relay delivered across crashes: each change of `ids` (one per id) at least once and nothing
    else; the duplicates of a change equal in every field of `same` (the key at least); every delivery's `op` when
    given; with `ordered`, the first delivery of each in the order of `ids`. Returns the number of duplicates."""
    ids = list(ids)
    by_id = {}
    for message in got:
        by_id.setdefault(message["data"]["id"], []).append(message["data"])
    assert set(by_id) == set(ids)
    for deliveries in by_id.values():
        for field in same:
            assert len({d[field] for d in deliveries}) == 1, deliveries
        if op is not None:
            assert all(d["op"] == op for d in deliveries), deliveries
    if ordered:
        first_seen = list(dict.fromkeys(message["data"]["id"] for message in got))
        assert first_seen == ids
    return len(got) - len(ids)


def assert_usage_error(stderr, *words):
    """A bad argument: its message is the first line, naming each of `words`; what follows is only the parser's
    hint (the choices when there are many, the option's help, the usage line, where to read more), never a trace."""
    lines = stderr.strip().splitlines()
    assert lines and lines[0].startswith("Error: "), stderr
    assert all(word in lines[0] for word in words), (words, stderr)
    hints = ("  - ", "Help:", "Usage:", "  See ")
    assert all(line.startswith(hints) for line in lines[1:]), stderr


def relay_fake_bin():
    """The `relay-fake` runner built beside the pubsub binary."""
    return os.path.join(os.path.dirname(pubsub_bin()), "relay-fake")


def start_fake(kind, *args):
    """`relay-fake <kind>`, once it listens; returns (process, port)."""
    fake = Lines([relay_fake_bin(), kind, *args])
    fake.wait_for(lambda: any(line.startswith("listening ") for line in fake.lines()), 30, f"the {kind} fake")
    port = int(next(line for line in fake.lines() if line.startswith("listening ")).split()[1])
    return fake, port


# Fixtures: each test module imports the ones it uses (`from relaykit import broker, workdir`).

@pytest.fixture
def broker():
    """A broker whose publishers must present SECRET, as the relay does."""
    with Broker(secret=SECRET) as b:
        yield b


@pytest.fixture
def workdir(request):
    """A temporary directory for checkpoints and configuration files, named after the suite."""
    suite = request.module.__name__.rpartition(".")[2].removeprefix("test_").replace("_", "-")
    with tempfile.TemporaryDirectory(prefix=f"pubsub-{suite}-") as d:
        yield d
