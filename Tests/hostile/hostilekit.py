"""Helpers of the hostile-client suite (Tests/hostile): a broker with the limits under test, the broker process's
memory and descriptors read from /proc, a well-behaved WebSocket subscriber that must keep being served, and raw
sockets that misbehave.

No pytest fixtures live here or in a conftest.py: every folder of Tests/ runs in one pytest call (scripts/test),
where a fixture of one folder's conftest.py can shadow another's. Tests start what they need with
`hostile_broker(...)`, a context manager.

Flags the broker under test may not have yet (the limits and timeouts of issue 13) are passed as their
`PUBSUB_*` environment variable when `pubsub serve --help` does not list them: a broker without them starts
all the same (and fails the test on its assertion, not at start-up).
"""

import contextlib
import errno
import json
import os
import re
import select
import socket
import subprocess
import time

import requests

from pubsubtest.broker import Broker, pubsub_bin
from pubsubtest.process import status_kib
from pubsubtest.wait import wait_until
from pubsubtest.websocket import BayeuxListener

KiB = 1 << 10
MiB = 1 << 20

RSS_BOUND = 64 * MiB       # the broker's resident memory may grow by this much over its baseline, never more
FD_SLACK = 6               # descriptors above the baseline still tolerated once an attack is over
SERVED_WITHIN = 3.0        # seconds in which the well-behaved client must get its own publish
HTTP_TIMEOUT = 10

# PROTOCOL.md section 1: ddd:STRING(,STRING)*:STRING or ddd::STRING
_S = r"[A-Za-z0-9\-_!~()$@ /*.]*"
ERROR_RE = re.compile(rf"^([0-9]{{3}}:{_S}(,{_S})*:{_S}|[0-9]{{3}}::{_S})$")


# ---------------------------------------------------------------- the broker

_serve_help = None


def serve_options():
    """The `--options` that `pubsub serve --help` lists (once per run)."""
    global _serve_help
    if _serve_help is None:
        out = subprocess.run([pubsub_bin(), "serve", "--help"], capture_output=True, text=True, timeout=30)
        _serve_help = set(re.findall(r"--[a-z][a-z0-9-]*", out.stdout + out.stderr))
    return _serve_help


def env_name(flag):
    return "PUBSUB_" + flag.upper().replace("-", "_")


class HostileBroker(Broker):
    """`pubsub serve` with `settings` {flag name without dashes: value}; a flag the binary does not list goes
    in its PUBSUB_* variable instead (ignored by a broker without it)."""

    def __init__(self, settings=None, *, timeout=5, **kw):
        args, self.env, self.missing = [], {}, []
        for name, value in (settings or {}).items():
            if f"--{name}" in serve_options():
                args += [f"--{name}", str(value)]
            else:
                self.env[env_name(name)] = str(value)
                self.missing.append(name)
        super().__init__(timeout=timeout, extra_args=args + list(kw.pop("extra_args", ())), **kw)

    def start(self):
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            return super().start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def describe(self):
        return f"(flags this broker does not list, passed as environment: {self.missing})" if self.missing else ""


# ---------------------------------------------------------------- the process, from /proc

def rss(pid):
    """Resident memory now, in bytes."""
    return status_kib(pid, "VmRSS") * KiB


def peak_rss(pid):
    """The largest resident memory the process ever had (VmHWM), in bytes."""
    return status_kib(pid, "VmHWM") * KiB


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---------------------------------------------------------------- /metrics and errors

def metric_value(b, name):
    """The sum of a metric's samples on /metrics (0 when absent)."""
    r = requests.get(f"http://127.0.0.1:{b.port}/metrics", timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.status_code
    total = 0.0
    for line in r.text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)", line)
        if m:
            total += float(m.group(2))
    return total


def assert_overflow_error(reply, cid):
    """The reply Faye's client expects of a client dropped for overflow: 409:<clientId>:Queue overflow, advice
    reconnect handshake."""
    assert reply.get("successful") is False, reply
    assert reply.get("error") == f"409:{cid}:Queue overflow", reply
    assert (reply.get("advice") or {}).get("reconnect") == "handshake", reply


# ---------------------------------------------------------------- the well-behaved client

class Probe(BayeuxListener):
    """A WebSocket subscriber that behaves (the shared threaded client, pubsubtest.websocket): it reads all the time
    (its library answers pings), sends the next /meta/connect when one is answered, and checks it is served by
    publishing on its own channel and waiting for the event."""

    def __init__(self, b, channel=None, timeout=HTTP_TIMEOUT):
        super().__init__(b, timeout=timeout)
        self.b = b
        self.channel = channel or f"/probe/{os.getpid()}/{time.monotonic_ns()}"
        self.seq = 0
        self.handshake()
        self.listen()
        reply = super().subscribe(self.channel, timeout=timeout)
        assert reply["successful"] is True, f"well-behaved client: {reply} {self.failures}"

    def served(self, within=SERVED_WITHIN, what=""):
        """Publishes on its own channel over its socket; the event must come back within `within` seconds."""
        assert not self.ended(), f"well-behaved client cut off {what}: {self.failures}"
        self.seq += 1
        token = f"probe-{self.seq}"
        t0 = time.monotonic()
        try:
            self.send([{"channel": self.channel, "data": token, "clientId": self.cid}])
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"well-behaved client: publish not sent {what}: {e!r} {self.failures}") from None
        self.wait_event(lambda m: m.get("channel") == self.channel and m.get("data") == token, within,
                        f"well-behaved client's event of its own publish {what}")
        return time.monotonic() - t0


def new_client_served(b, timeout=3):
    """A new connection gets a handshake answered (HTTP 200, successful)."""
    try:
        r = requests.post(b.url, data=json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                                   "supportedConnectionTypes": ["long-polling"]}]),
                          headers={"Content-Type": "application/json", "Connection": "close"}, timeout=timeout)
    except requests.RequestException as e:
        return f"new client: {e!r}"
    if r.status_code != 200:
        return f"new client: HTTP {r.status_code} {r.text[:100]!r}"
    return True


# ---------------------------------------------------------------- the guard around each attack

class Guard:
    """Baseline of the broker process (RSS, descriptors) with the probe connected; checks during and after."""

    def __init__(self, b):
        self.b = b
        self.pid = b.pid
        self.probe = Probe(b)
        self.probe.served(within=5, what="before the attack")
        time.sleep(0.2)
        self.rss0 = rss(self.pid)
        self.fds0 = open_fds(self.pid)

    def growth(self):
        """Peak resident memory over the baseline, in bytes."""
        return peak_rss(self.pid) - self.rss0

    def over_bound(self):
        return self.growth() > RSS_BOUND

    def assert_alive(self):
        assert self.b.alive(), f"broker died (rc={self.b.returncode}):\n{self.b.log()[-3000:]}"

    def assert_rss(self, what=""):
        self.assert_alive()
        g = self.growth()
        assert g <= RSS_BOUND, (f"broker RSS grew by {g / MiB:.0f} MiB {what} (bound {RSS_BOUND // MiB} MiB; "
                                f"baseline {self.rss0 / MiB:.0f} MiB) {self.b.describe()}")

    def assert_fds_back(self, timeout=5, what=""):
        n = wait_until(lambda: open_fds(self.pid) <= self.fds0 + FD_SLACK, timeout, raises=False)
        now = open_fds(self.pid)
        assert n, (f"broker has {now} descriptors {timeout}s after {what or 'the attack'} "
                   f"(baseline {self.fds0}) {self.b.describe()}")

    def assert_served(self, what=""):
        self.assert_alive()
        self.probe.served(what=what)

    def close(self):
        self.probe.close()


@contextlib.contextmanager
def hostile_broker(settings=None, *, timeout=5, **kw):
    """A broker with `settings` and a guard (probe connected, baseline taken); both stopped afterwards."""
    b = HostileBroker(settings, timeout=timeout, **kw)
    b.start()
    guard = None
    try:
        # The engine is ready (the Redis engine connects after the port opens): a handshake is answered.
        if not wait_until(lambda: new_client_served(b) is True, 15, interval=0.1, raises=False):
            raise AssertionError(f"broker not ready: {new_client_served(b)}\n{b.log()[-2000:]}")
        guard = Guard(b)
        yield b, guard
    finally:
        if guard is not None:
            guard.close()
        b.stop()


# ---------------------------------------------------------------- raw sockets

def raw_socket(b, rcvbuf=None, timeout=5):
    """A TCP connection to the broker; `rcvbuf` shrinks its receive buffer (set before connecting, so the
    window is small) for a client that never reads."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect(("127.0.0.1", b.port))
    return s


def send_for(s, data, seconds, stop=None):
    """Sends `data` (bytes, or a callable giving the next piece) without blocking for longer than `seconds` in
    all; returns the bytes the kernel took. Stops early when the peer closes or `stop()` says so."""
    sent = 0
    s.setblocking(False)
    deadline = time.monotonic() + seconds
    pending = memoryview(data if isinstance(data, (bytes, bytearray)) else data())
    try:
        while time.monotonic() < deadline:
            if stop is not None and stop():
                break
            if not pending:
                if isinstance(data, (bytes, bytearray)):
                    break
                nxt = data()
                if nxt is None:
                    break
                pending = memoryview(nxt)
            _, writable, _ = select.select([], [s], [], 0.1)
            if not writable:
                continue
            try:
                n = s.send(pending[:256 * KiB])
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += n
            pending = pending[n:]
    finally:
        s.setblocking(True)
    return sent


def peer_closed(s):
    """True when the broker closed (or reset) the connection; reads and discards whatever is waiting."""
    try:
        readable, _, _ = select.select([s], [], [], 0)
        if not readable:
            return False
        s.setblocking(False)
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return True
        except BlockingIOError:
            return False
        finally:
            s.setblocking(True)
    except (ConnectionResetError, BrokenPipeError):
        return True
    except OSError as e:
        return e.errno in (errno.ECONNRESET, errno.EPIPE, errno.EBADF)


def read_to_eof(s, timeout, limit=256 * MiB):
    """Reads until the peer closes (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    got = 0
    while time.monotonic() < deadline and got < limit:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(1 << 20)
        except socket.timeout:
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True
        if not chunk:
            return True
        got += len(chunk)
    return False


def close_all(sockets):
    for s in sockets:
        try:
            s.close()
        except OSError:
            pass


def read_http_head(s, timeout=5):
    """Reads up to the end of a response head; returns (status, {lower name: value}, bytes after the head)."""
    s.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while b"\r\n\r\n" not in data:
        if time.monotonic() > deadline:
            raise AssertionError(f"no response head in time: {data[:200]!r}")
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response head: {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), f"not a status line: {lines[0]!r} (after {data[:300]!r})"
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, rest


def read_more(s, seconds):
    """Whatever arrives on `s` within `seconds` (the peer closing ends it early)."""
    data = b""
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return data
        s.settimeout(remaining)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return data
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def ones_body(n):
    """`[1,1,…,1]` with n elements: n messages that are not objects."""
    return b"[" + b",".join([b"1"] * n) + b"]"


def post_request(port, body, path="/faye", content_type="application/json"):
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
