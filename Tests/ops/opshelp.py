"""Helpers of the operations suite (Tests/ops): a server process with its own environment, a systemd
notification socket owned by the test, Bayeux calls over HTTP(S), certificates."""

import json
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
from pubsubtest.broker import Broker, pubsub_bin  # noqa: F401  (re-exported for the test modules)
from pubsubtest.ports import free_port  # noqa: F401  (re-exported for the test modules)
from pubsubtest.bayeux import bayeux, connect, subscribe  # noqa: F401  (re-exported for the test modules)
from pubsubtest.bayeux import handshake as bayeux_handshake, publish as bayeux_publish
from pubsubtest.metrics import held, metric, scrape, wait_held  # noqa: F401  (re-exported for the test modules)
from pubsubtest.tls import make_self_signed as make_certificate  # noqa: F401  (re-exported for the test modules)
from pubsubtest.wait import wait_until

HTTP_TIMEOUT = 10


class Process:
    """`pubsub serve` started directly (not through Broker) with extra environment, e.g. NOTIFY_SOCKET, or
    through a launcher (socket activation). Output is collected; stop() sends SIGTERM and waits."""

    def __init__(self, args, env=None, launcher=None, pass_fds=(), nofile=None):
        environment = dict(os.environ)
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
            environment.pop(key, None)
        environment.update(env or {})
        cmd = [pubsub_bin(), "serve"] + list(args)
        if launcher:
            cmd = [sys.executable, launcher] + cmd
        self.out = []
        self.lock = threading.Lock()
        # nofile=(soft, hard): the process's RLIMIT_NOFILE, set in the child before it runs the broker.
        preexec = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)) if nofile else None
        self.proc = subprocess.Popen(cmd, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, pass_fds=pass_fds, start_new_session=True,
                                     preexec_fn=preexec)
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self):
        for line in iter(self.proc.stdout.readline, b""):
            with self.lock:
                self.out.append(line.decode("utf-8", "replace"))

    def log(self):
        with self.lock:
            return "".join(self.out)

    @property
    def pid(self):
        return self.proc.pid

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout=15):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.reader.join(timeout=2)
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


class NotifySocket:
    """The unix datagram socket systemd would own: the test reads what the broker sends to NOTIFY_SOCKET."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pubsub-notify-")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages = []  # (monotonic time, text)
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while self.running:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.messages.append((time.monotonic(), data.decode("utf-8", "replace")))

    def all(self):
        with self.lock:
            return list(self.messages)

    def lines(self, key):
        """Every `KEY=value` line sent so far for `key`, with its arrival time."""
        found = []
        for at, text in self.all():
            for line in text.split("\n"):
                if line.startswith(key + "="):
                    found.append((at, line[len(key) + 1:]))
        return found

    def wait_for(self, key, value=None, timeout=30, pattern=None):
        def match():
            for at, v in self.lines(key):
                if (value is None or v == value) and (pattern is None or re.search(pattern, v)):
                    return at, v
            return None
        return wait_until(match, timeout, message=f"{key}={value or pattern or '…'} on NOTIFY_SOCKET "
                                                     f"(got {self.all()!r})")

    def close(self):
        self.running = False
        self.sock.close()
        try:
            os.unlink(self.path)
            os.rmdir(self.dir)
        except OSError:
            pass


# ---------------------------------------------------------------- Bayeux over HTTP

def post(url, body, *, timeout=HTTP_TIMEOUT, verify=True, headers=None, session=None):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    call = session.post if session is not None else requests.post
    return call(url, data=json.dumps(body), headers=h, timeout=timeout, verify=verify)


# The suite's handshakes offer WebSocket too (a client may go on over one), and its publishes return the reply
# unasserted: the tests judge what was delivered.
handshake = partial(bayeux_handshake, types=("long-polling", "websocket"))
publish = partial(bayeux_publish, check=False)


# ---------------------------------------------------------------- certificates

def served_certificate(port):
    """The DER bytes of the certificate a new TLS connection to the port is given."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def der_of(cert_path):
    with open(cert_path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read())
