"""`rediss://`: the Redis engine over TLS to a redis-server that listens on TLS only, with a certificate from a test
authority made here by openssl; once to one server, once through a sentinel that also speaks TLS only, once to a
Redis Cluster whose nodes speak TLS only (clients and cluster bus)."""

import os
import shutil
import subprocess
import tempfile

import pytest
import requests

from cluster_helpers import BayeuxWebSocket, handshake, publish, subscribe
from pubsubtest.broker import Broker
from pubsubtest.ports import free_port
from pubsubtest.redis import RedisServer, Sentinel, wait_ready
from pubsubtest.tls import make_authority
from pubsubtest.wait import wait_until


@pytest.fixture(scope="module")
def certificates():
    """A private certificate authority, and a certificate it signed for 127.0.0.1 (server and client use)."""
    d = tempfile.mkdtemp(prefix="pubsub-redis-certs-")
    yield make_authority(d, authority="pubsub redis test CA")
    shutil.rmtree(d, ignore_errors=True)


def tls_args(c):
    return ["--tls-cert-file", c["server.pem"], "--tls-key-file", c["server.key"], "--tls-ca-cert-file", c["ca.pem"],
            "--tls-auth-clients", "no"]


class TLSRedis(RedisServer):
    """redis-server listening on TLS only (`--port 0 --tls-port P`)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.extra_args = tls_args(c) + ["--tls-port", str(self.port), "--tls-replication", "yes"]

    def start(self):
        self.proc = subprocess.Popen(
            ["timeout", "--signal=KILL", "900", self.binary, "--port", "0", "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--logfile", os.path.join(self.dir, "log")] + self.extra_args,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.wait_answering("TLS redis")

    def command(self, *args):
        out = subprocess.run(["redis-cli", "--tls", "--cacert", self.c["ca.pem"], "-h", "127.0.0.1", "-p", str(self.port),
                              *map(str, args)], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()


class TLSSentinel(Sentinel):
    def __init__(self, c, master):
        super().__init__(master, quorum=1)
        self.c = c
        with open(self.config) as f:
            config = f.read().replace(f"port {self.port}\n", "port 0\n")
        with open(self.config, "w") as f:
            f.write(config + f"tls-port {self.port}\ntls-replication yes\ntls-cert-file {c['server.pem']}\n"
                    f"tls-key-file {c['server.key']}\ntls-ca-cert-file {c['ca.pem']}\ntls-auth-clients no\n")

    command = TLSRedis.command

    def start(self):
        self.proc = subprocess.Popen(["timeout", "--signal=KILL", "900", self.binary, self.config, "--sentinel"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.wait_answering("TLS redis-sentinel")


def delivered_across_two_nodes(nodes):
    a, b = nodes
    client = BayeuxWebSocket(b, handshake(b))
    try:
        subscribe(b, client.cid, "/tls")
        client.connect()
        client.read(lambda ms: any(m.get("channel") == "/meta/connect" for m in ms))
        assert publish(a, "/tls", "over TLS")["successful"]
        client.read(lambda ms: any(m.get("channel") == "/tls" for m in ms))
        assert [m["data"] for m in client.events()] == ["over TLS"]
    finally:
        client.close()


def wait_redis_ready(b, timeout=15):
    """/readyz answers 200 only once the engine's connections to Redis are up (a handshake works without)."""
    wait_ready(b)
    if wait_until(lambda: requests.get(f"http://127.0.0.1:{b.port}/readyz", timeout=5).status_code == 200, timeout,
                  0.1, raises=False):
        return
    raise AssertionError(f"node not ready:\n{b.log()[-3000:]}")


def start_nodes(args, count=2):
    nodes = []
    for _ in range(count):
        b = Broker(timeout=10, extra_args=["--engine", "redis", "--log-level", "info"] + args)
        b.start()
        nodes.append(b)
    return nodes


def test_rediss_to_one_server_with_a_ca_file(certificates):
    server = TLSRedis(certificates)
    server.start()
    nodes = []
    try:
        url = f"rediss://127.0.0.1:{server.port}/0"
        nodes = start_nodes(["--redis-url", url, "--redis-ca-file", certificates["ca.pem"]])
        for b in nodes:
            wait_redis_ready(b)
        delivered_across_two_nodes(nodes)
        assert int(server.command("INFO", "clients").split("connected_clients:")[1].split()[0]) >= 4
        # Without the authority, the system's trust store does not know the server's certificate: never ready.
        untrusting = start_nodes(["--redis-url", url], count=1)
        nodes += untrusting
        wait_ready(untrusting[0])
        assert requests.get(f"http://127.0.0.1:{untrusting[0].port}/readyz", timeout=5).status_code == 503
        assert "CERTIFICATE_VERIFY_FAILED" in untrusting[0].log()
        # Plain RESP to a TLS port is refused the same way.
        plain = start_nodes(["--redis-url", f"redis://127.0.0.1:{server.port}/0"], count=1)
        nodes += plain
        wait_ready(plain[0])
        assert requests.get(f"http://127.0.0.1:{plain[0].port}/readyz", timeout=5).status_code == 503
    finally:
        for b in nodes:
            b.stop()
        server.stop()


def test_rediss_through_a_sentinel_that_speaks_tls(certificates):
    master = TLSRedis(certificates)
    master.start()
    sentinel = TLSSentinel(certificates, master)
    sentinel.start()
    nodes = []
    try:
        nodes = start_nodes(["--redis-sentinels", f"rediss://127.0.0.1:{sentinel.port}",
                             "--redis-master-name", "rediss://mymaster", "--redis-ca-file", certificates["ca.pem"]])
        for b in nodes:
            wait_redis_ready(b)
        delivered_across_two_nodes(nodes)
    finally:
        for b in nodes:
            b.stop()
        sentinel.stop()
        master.stop()


def test_rediss_to_a_redis_cluster_that_speaks_tls(certificates):
    servers = []
    nodes = []
    try:
        for _ in range(3):
            server = TLSRedis(certificates)
            server.extra_args += ["--tls-cluster", "yes", "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                                  "--cluster-config-file",
                                  "nodes.conf", "--cluster-node-timeout", "1000"]
            server.start()
            servers.append(server)
        out = subprocess.run(["redis-cli", "--tls", "--cacert", certificates["ca.pem"], "--cluster", "create",
                              *[f"127.0.0.1:{s.port}" for s in servers], "--cluster-yes"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        wait_until(lambda: all("cluster_state:ok" in s.command("CLUSTER", "INFO") for s in servers), 30, 0.1,
                   message="the TLS cluster ready")
        seeds = ",".join(f"rediss://127.0.0.1:{s.port}" for s in servers[1:])
        nodes = start_nodes(["--redis-cluster", seeds, "--redis-ca-file", certificates["ca.pem"]])
        for b in nodes:
            wait_redis_ready(b)
        delivered_across_two_nodes(nodes)
        # Without the authority: never ready, and the log says why.
        untrusting = start_nodes(["--redis-cluster", seeds], count=1)
        nodes += untrusting
        wait_ready(untrusting[0])
        wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in untrusting[0].log(), 15,
                   message="the node refusing Redis's certificate")
        assert requests.get(f"http://127.0.0.1:{untrusting[0].port}/readyz", timeout=5).status_code == 503
        assert "CERTIFICATE_VERIFY_FAILED" in untrusting[0].log()
    finally:
        for b in nodes:
            b.stop()
        for s in servers:
            s.stop()


def test_bad_redis_flags_are_refused_with_one_line(certificates):
    binary = os.environ.get("PUBSUB_BIN", os.path.join(os.path.dirname(__file__), "..", "..", ".build", "debug", "pubsub"))
    cases = [
        (["--redis-url", "redis://127.0.0.1:1/0", "--redis-sentinels", "127.0.0.1:26379", "--redis-master-name", "m"],
         "cannot be used together"),
        (["--redis-sentinels", "127.0.0.1:26379"], "--redis-master-name"),
        (["--redis-master-name", "m"], "needs --redis-sentinels"),
        (["--redis-sentinels", "127.0.0.1:x", "--redis-master-name", "m"], "invalid sentinel"),
        (["--redis-url", "rediss://127.0.0.1:1/0", "--redis-ca-file", "/nonexistent/ca.pem"], "cannot read"),
        (["--redis-cluster", "127.0.0.1:7000", "--redis-url", "redis://127.0.0.1:1/0"], "cannot be used with"),
        (["--redis-cluster", "127.0.0.1:7000", "--redis-sentinels", "127.0.0.1:26379"], "cannot be used with"),
        (["--redis-cluster", "127.0.0.1:x"], "invalid cluster node"),
        (["--redis-cluster", "redis://127.0.0.1:7000/2"], "only database 0"),
        (["--redis-cluster", "rediss://a:1,redis://b:1"], "same scheme"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PUBSUB_")}
    for args, needle in cases:
        out = subprocess.run([binary, "serve", "--engine", "redis", *args], capture_output=True, text=True, timeout=20,
                             env=env)
        assert out.returncode != 0, (args, out.stdout, out.stderr)
        assert needle in out.stderr, (args, out.stderr)
