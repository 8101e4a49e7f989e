"""redis-server for the suites that run several nodes on one Redis (cluster, api, webhooks, hostile), and the wait
for a node whose engine reached it."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile

from .bayeux import bayeux
from .ports import free_port
from .wait import wait_until


class RedisServer:
    """redis-server on a loopback port, without persistence: a restart loses everything, the worst case."""

    def __init__(self, extra_args=()):
        self.binary = shutil.which("redis-server")
        if not self.binary:
            raise RuntimeError("redis-server not found: apt-get install redis-server (scripts/install-test-deps)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="pubsub-cluster-redis-")
        self.proc = None
        self.extra_args = list(extra_args)
        self.started = False

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        """Starts the server; on its first start, again on a new port if the port was taken (a restart keeps the
        port its clients know)."""
        for attempt in range(3):
            if self._start_once():
                self.started = True
                return
            if self.started or attempt == 2 or "Address already in use" not in self.log():
                break
            self.kill()
            self.port = free_port()
        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{self.log()}")

    def _start_once(self):
        # Bounded life (timeout): a crashed test run leaves no server behind for long.
        self.proc = subprocess.Popen(
            ["timeout", "--signal=KILL", "900", self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--logfile", os.path.join(self.dir, "log")]
            + self.extra_args,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        return wait_until(lambda: self._pong() or self.proc.poll() is not None, 10, raises=False) \
            and self.proc.poll() is None

    def _pong(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *args):
        """One command through redis-cli; its reply as text."""
        out = subprocess.run(["redis-cli", "-p", str(self.port), *map(str, args)], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip()

    def wait_answering(self, what):
        """Waits until `command("PING")` answers PONG (10 s at most); raises with the log when it does not."""
        if wait_until(lambda: self.command("PING") == "PONG" or self.proc.poll() is not None, 10, raises=False) \
                and self.proc.poll() is None:
            return
        raise RuntimeError(f"{what} did not start on port {self.port}:\n{self.log()}")

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
        self.wait_answering("redis-sentinel")

    def stop(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_ready(b, timeout=15):
    """Waits until the node answers a handshake (its engine reached Redis)."""
    if wait_until(lambda: bayeux(b, {"channel": "/meta/handshake", "version": "1.0",
                                     "supportedConnectionTypes": ["long-polling"]})[0].get("successful"),
                  timeout, 0.1, raises=False, ignore=(Exception,)):
        return
    raise RuntimeError(f"node on port {b.port} not ready:\n{b.log()}")


class RedisCluster:
    """A Redis Cluster on loopback: `masters` redis-server processes in cluster mode, each with `replicas`
    replicas, joined with `redis-cli --cluster create`; ready when every node says `cluster_state:ok`."""

    def __init__(self, masters=3, replicas=1, node_timeout_ms=1000):
        self.nodes = [RedisServer(extra_args=[
            "--cluster-enabled", "yes", "--cluster-port", str(free_port()), "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms)]) for _ in range(masters * (1 + replicas))]
        self.replicas = replicas

    def start(self):
        try:
            for node in self.nodes:
                node.start()
            out = subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
                                  "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def wait_ok(self, timeout=30):
        """Every live node says cluster_state:ok with all slots assigned, and every replica is in sync."""
        if wait_until(self._ok, timeout, 0.1, raises=False):
            return
        raise RuntimeError("the Redis Cluster did not become ready:\n" + self.nodes[0].log())

    def _ok(self):
        live = [n for n in self.nodes if n.proc.poll() is None]
        infos = [n.command("CLUSTER", "INFO") for n in live]
        replication = [n.command("INFO", "replication") for n in live]
        return all("cluster_state:ok" in i and "cluster_slots_assigned:16384" in i for i in infos) and all(
            "role:master" in r or "master_link_status:up" in r for r in replication)

    @property
    def seeds(self):
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def node(self, port):
        return next(n for n in self.nodes if n.port == port)

    def slot(self, key):
        return int(self.nodes[0].command("CLUSTER", "KEYSLOT", key))

    def owner(self, slot, asking=None):
        """The master serving `slot`, as a live node sees it."""
        asking = asking or next(n for n in self.nodes if n.proc.poll() is None)
        for line in asking.command("CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for r in fields[8:]:
                first, _, last = r.partition("-")
                if r[0] != "[" and int(first) <= slot <= int(last or first):
                    return self.node(int(fields[1].split(":")[1].split("@")[0]))
        return None

    def node_id(self, node):
        return node.command("CLUSTER", "MYID")

    def stop(self):
        for node in self.nodes:
            node.stop()
