"""Processes and subscribers shared by the relay suites: the broker, `pubsub subscribe`, the relay, the fakes."""

import json
import os
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from broker import Broker, pubsub_bin

SECRET = "relay-secret"


class Lines:
    """A process whose stdout (and stderr) lines are collected by threads."""

    def __init__(self, cmd):
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.out = []
        self.err = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
                        threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self, stream, into):
        for line in iter(stream.readline, b""):
            with self.lock:
                into.append(line.decode("utf-8", "replace").rstrip("\n"))

    def lines(self):
        with self.lock:
            return list(self.out)

    def errors(self):
        with self.lock:
            return "\n".join(self.err)

    def wait_for(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None and not predicate():
                time.sleep(0.2)
                if predicate():
                    return
                raise AssertionError(f"{self.cmd[1]} exited with {self.proc.returncode} before {what}:\n"
                                     f"{self.errors()}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n{self.errors()[-3000:]}")

    def kill9(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for t in self.threads:
            t.join(timeout=2)


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
