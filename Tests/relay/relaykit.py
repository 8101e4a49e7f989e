"""Processes and subscribers shared by the relay suites: the broker, `pubsub subscribe`, the relay, the fakes."""

import json
import os
import signal
import subprocess
import threading
import time

from broker import pubsub_bin

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



def relay_fake_bin():
    """The `relay-fake` runner built beside the pubsub binary."""
    return os.path.join(os.path.dirname(pubsub_bin()), "relay-fake")


def start_fake(kind, *args):
    """`relay-fake <kind>`, once it listens; returns (process, port)."""
    fake = Lines([relay_fake_bin(), kind, *args])
    fake.wait_for(lambda: any(line.startswith("listening ") for line in fake.lines()), 30, f"the {kind} fake")
    port = int(next(line for line in fake.lines() if line.startswith("listening ")).split()[1])
    return fake, port
