"""Helpers of the cluster suite: a redis-server that can be killed and restarted, and Bayeux over HTTP and WebSocket."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests
import websocket

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "wire"))
from broker import Broker  # noqa: E402

HTTP_TIMEOUT = 10


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """redis-server on a loopback port, without persistence: a restart loses everything, the worst case."""

    def __init__(self, extra_args=()):
        self.binary = shutil.which("redis-server")
        if not self.binary:
            raise RuntimeError("redis-server not found: apt-get install redis-server (scripts/install-test-deps)")
        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="pubsub-cluster-redis-")
        self.proc = None
        self.extra_args = list(extra_args)

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        # Bounded life (timeout): a crashed test run leaves no server behind for long.
        self.proc = subprocess.Popen(
            ["timeout", "--signal=KILL", "900", self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--logfile", os.path.join(self.dir, "log")] + self.extra_args,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def command(self, *args):
        """One command through redis-cli; its reply as text."""
        out = subprocess.run(["redis-cli", "-p", str(self.port), *map(str, args)], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip()

    def server_pid(self):
        """The redis-server process under `timeout`."""
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
            return int(f.read().split()[0])

    def log(self):
        try:
            with open(os.path.join(self.dir, "log")) as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def kill(self):
        """SIGKILL to the whole group: `timeout` and the server under it."""
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=5)

    def stop(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Sentinel(RedisServer):
    """A Redis Sentinel on a loopback port, watching the master `name` (Debian's redis-sentinel, or the same
    binary as redis-server started with --sentinel: they are one program)."""

    def __init__(self, master, name="mymaster", quorum=2, down_after_ms=1000, failover_timeout_ms=5000):
        super().__init__()
        self.config = os.path.join(self.dir, "sentinel.conf")
        with open(self.config, "w") as f:
            f.write(f"""port {self.port}
bind 127.0.0.1
daemonize no
dir {self.dir}
logfile {os.path.join(self.dir, "log")}
sentinel monitor {name} 127.0.0.1 {master.port} {quorum}
sentinel down-after-milliseconds {name} {down_after_ms}
sentinel failover-timeout {name} {failover_timeout_ms}
sentinel parallel-syncs {name} 1
""")

    def start(self):
        sentinel = shutil.which("redis-sentinel")
        command = [sentinel, self.config] if sentinel else [self.binary, self.config, "--sentinel"]
        self.proc = subprocess.Popen(["timeout", "--signal=KILL", "900"] + command, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.command("PING") == "PONG":
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"redis-sentinel did not start on port {self.port}:\n{self.log()}")

    def stop(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_ready(b, timeout=15):
    """Waits until the node answers a handshake (its engine reached Redis)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = post(b, {"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["long-polling"]})
            if r[0].get("successful"):
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"node on port {b.port} not ready:\n{b.log()}")


# ---------------------------------------------------------------- Bayeux over HTTP and WebSocket

def post(b, messages, timeout=HTTP_TIMEOUT):
    r = requests.post(b.url, data=json.dumps(messages), headers={"Content-Type": "application/json"},
                      timeout=timeout)
    r.raise_for_status()
    return r.json()


def handshake(b):
    reply = post(b, {"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["long-polling", "websocket"]})[0]
    assert reply["successful"], reply
    return reply["clientId"]


def subscribe(b, cid, channel):
    reply = post(b, {"channel": "/meta/subscribe", "clientId": cid, "subscription": channel})[0]
    assert reply["successful"], reply
    return reply


def publish(b, channel, data, timeout=HTTP_TIMEOUT):
    return post(b, {"channel": channel, "data": data}, timeout=timeout)[0]


def long_poll(b, cid, timeout=HTTP_TIMEOUT):
    """One /meta/connect; returns (reply, events)."""
    replies = post(b, {"channel": "/meta/connect", "clientId": cid, "connectionType": "long-polling",
                       "advice": {"timeout": 0}}, timeout=timeout)
    connect = [m for m in replies if m.get("channel") == "/meta/connect"][0]
    events = [m for m in replies if m.get("channel") != "/meta/connect"]
    return connect, events


class WSClient:
    """A Bayeux client over one WebSocket, bound to a client id (which may come from another node)."""

    def __init__(self, b, cid):
        self.cid = cid
        self.ws = websocket.create_connection(b.ws_url, timeout=HTTP_TIMEOUT)
        self.pending = []

    def send(self, messages):
        self.ws.send(json.dumps(messages))

    def connect(self):
        self.send([{"channel": "/meta/connect", "clientId": self.cid, "connectionType": "websocket",
                    "advice": {"timeout": 0}}])

    def read(self, until, timeout=10):
        """Reads frames until `until(all messages so far)` is true or the time is up; returns the messages."""
        deadline = time.monotonic() + timeout
        while not until(self.pending) and time.monotonic() < deadline:
            self.ws.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                frame = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                break
            if frame:
                self.pending.extend(json.loads(frame))
        return self.pending

    def events(self):
        return [m for m in self.pending if not m.get("channel", "").startswith("/meta/")]

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
