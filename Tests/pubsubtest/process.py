"""Processes the tests start and watch: their output lines collected by threads, SIGKILL or SIGTERM to their
process group."""

import os
import signal
import subprocess
import threading

from .wait import wait_until


def status_kib(pid, field):
    """A `/proc/<pid>/status` field counted in kB (`VmRSS`, `VmHWM`, ...)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def stop_group(proc, timeout=10):
    """SIGTERM to `proc`'s process group (started with `start_new_session=True`), SIGKILL if it is still there after
    `timeout` seconds; a group already gone is fine."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


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
        """Waits until `predicate()` holds; fails when the process exits first (its output read to the end) or
        after `timeout` seconds."""
        if wait_until(lambda: predicate() or self.proc.poll() is not None, timeout, raises=False):
            if predicate():
                return
            for t in self.threads:
                t.join(timeout=2)  # its last lines read
            if predicate():
                return
            raise AssertionError(f"{self.cmd[1]} exited with {self.proc.returncode} before {what}:\n"
                                 f"{self.errors()}")
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
