"""`pubsub serve --reuse-port`: two broker processes on one port and one redis-server form one cluster.

The kernel spreads new connections over the processes that share the port (SO_REUSEPORT); each broker's own
`--metrics-port` shows that both took some, and a publish that lands on one reaches subscribers held by the other.
Without the flag a second broker on the port stops at once with a one-line error and a non-zero exit.
redis-server must be installed (scripts/install-test-deps does it); a missing one fails the suite, never skips it.
"""

import json
import os
import socket
import subprocess

import requests

from pubsubtest.broker import pubsub_bin
from pubsubtest.ports import free_port
from pubsubtest.wait import wait_until
from pubsubtest.websocket import BayeuxWebSocket

CLIENTS = 40


def serve(port, redis_url, *extra, env=None, capture=False):
    """A broker on `port`; its output is kept only when `capture` (a broker that is expected to stop at once)."""
    cmd = [pubsub_bin(), "serve", "--host", "127.0.0.1", "--port", str(port), "--engine", "redis",
           "--redis-url", redis_url, "--log-level", "info", *extra]
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                            start_new_session=True, env=env)


def wait_healthy(proc, metrics_port, timeout=20):
    def ready():
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        return requests.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=1).status_code == 200

    if wait_until(ready, timeout, 0.1, raises=False, ignore=(requests.RequestException,)):
        return
    raise RuntimeError(f"broker with metrics on {metrics_port} not ready")


def accepted(metrics_port):
    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("pubsub_connections_accepted_total"):
            return float(line.split()[-1])
    raise AssertionError(f"no pubsub_connections_accepted_total in:\n{text}")


def stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=5)


def subscriber(port, channel):
    """Handshake, subscribe and connect over one WebSocket to the shared port."""
    s = BayeuxWebSocket(f"ws://127.0.0.1:{port}/faye")
    s.handshake()
    s.subscribe(channel)
    s.connect()
    assert s.wait_for("/meta/connect")["successful"]
    return s


def test_two_brokers_share_a_port_and_form_one_cluster(redis_server):
    port = free_port()
    metrics = [free_port(), free_port()]
    brokers = []
    subscribers = []
    try:
        # One by the flag, one by the environment variable.
        brokers.append(serve(port, redis_server.url, "--reuse-port", "--metrics-port", str(metrics[0])))
        brokers.append(serve(port, redis_server.url, "--metrics-port", str(metrics[1]),
                             env=dict(os.environ, PUBSUB_REUSE_PORT="1")))
        for proc, m in zip(brokers, metrics):
            wait_healthy(proc, m)
        before = [accepted(m) for m in metrics]
        subscribers = [subscriber(port, "/shared") for _ in range(CLIENTS)]
        spread = [accepted(m) - b for m, b in zip(metrics, before)]
        assert sum(spread) >= CLIENTS
        # Both processes took connections (all 40 on one side: 2^-39 with the kernel's hash).
        assert spread[0] >= 1 and spread[1] >= 1, spread

        # A publish through one broker reaches the subscribers of both.
        publisher = subscribers[0]
        publisher.send([{"channel": "/shared", "clientId": publisher.cid, "data": {"n": 1}}])
        for s in subscribers:
            event = s.wait_for("/shared", event=True)
            assert event["data"] == {"n": 1}

        # Without the flag, a third broker on the same port fails at once, with one clear line.
        third = serve(port, redis_server.url, capture=True)
        try:
            third.wait(timeout=20)
        except subprocess.TimeoutExpired:
            stop(third)
            raise AssertionError("a broker without --reuse-port kept running on a shared port")
        err = third.stderr.read().decode()
        assert third.returncode != 0
        lines = [l for l in err.splitlines() if l.strip() and "address in use" in l]
        assert len(lines) == 1, err
        assert f"cannot listen on 127.0.0.1:{port}" in lines[0] and "--reuse-port" in lines[0], err
    finally:
        for s in subscribers:
            s.close()
        for proc in brokers:
            stop(proc)


def gauge(metrics_port, name):
    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} in:\n{text}")


def test_a_full_broker_leaves_the_shared_port_to_the_others(redis_server):
    """Two brokers with room for 20 connections each, each leaving the port at 19: of 37 clients one broker gets
    19 whatever the kernel's spread, and all get in (none answered 503 by a full broker while the other has
    room); neither holds more than its limit. Once clients leave the full broker, it listens again and takes new
    ones."""
    port = free_port()
    metrics = [free_port(), free_port()]
    brokers = []
    subscribers = []
    try:
        for m in metrics:
            brokers.append(serve(port, redis_server.url, "--reuse-port", "--max-connections", "20",
                                 "--metrics-port", str(m)))
        for proc, m in zip(brokers, metrics):
            wait_healthy(proc, m)
        for _ in range(37):
            subscribers.append(subscriber(port, "/full"))
        held = [gauge(m, "pubsub_connections") for m in metrics]
        refused = [gauge(m, "pubsub_connections_refused_total") for m in metrics]
        assert sum(held) == 37 and max(held) <= 20, held
        assert refused == [0, 0], refused
        full = 0 if held[0] >= held[1] else 1
        assert held[full] >= 19, f"one broker filled and left the port: {held}"

        # The full broker's clients leave: it listens again, and some of the next clients are its own.
        before = accepted(metrics[full])
        for s in subscribers:
            s.close()
        subscribers = []
        wait_until(lambda: gauge(metrics[full], "pubsub_connections") == 0, 20, 0.05)
        subscribers = [subscriber(port, "/full") for _ in range(20)]
        assert accepted(metrics[full]) > before, "the broker that left the port never took a connection again"
    finally:
        for s in subscribers:
            s.close()
        for proc in brokers:
            stop(proc)


def test_a_second_broker_without_the_flag_is_refused(redis_server):
    port = free_port()
    first = serve(port, redis_server.url, "--metrics-port", str(free_port()))
    try:
        wait_until(lambda: socket.create_connection(("127.0.0.1", port), timeout=0.5).close() or True, 20, 0.1,
                   raises=False, ignore=(OSError,))
        second = serve(port, redis_server.url, "--reuse-port", capture=True)
        assert second.wait(timeout=20) != 0
        err = second.stderr.read().decode().strip()
        assert "address in use" in err and "without --reuse-port" in err, err
        assert first.poll() is None
    finally:
        stop(first)


def test_bench_spreads_clients_over_brokers_on_several_ports(redis_server):
    """`pubsub bench --url A --url B --workers 2`: subscribers on both brokers, every delivery crossing Redis counted."""
    ports = [free_port(), free_port()]
    metrics = [free_port(), free_port()]
    brokers = []
    try:
        for port, m in zip(ports, metrics):
            brokers.append(serve(port, redis_server.url, "--metrics-port", str(m)))
        for proc, m in zip(brokers, metrics):
            wait_healthy(proc, m)
        before = [accepted(m) for m in metrics]
        cmd = [pubsub_bin(), "bench", "--json", "--quiet", "--workers", "2", "--subscribers", "10",
               "--rate", "10", "--duration", "1", "--warmup", "0.3"]
        for port in ports:
            cmd += ["--url", f"http://127.0.0.1:{port}/faye"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
        report = json.loads(done.stdout)
        assert report["connected"] == 11 and report["connect_failures"] == 0
        assert report["lost"] == 0 and report["errors"] == 0, report
        assert report["received_deliveries"] == report["expected_deliveries"] >= 10 * report["publishes"] > 0
        # Five subscribers on each broker (client i on URL i mod 2), the publisher on the first.
        spread = [accepted(m) - b for m, b in zip(metrics, before)]
        assert spread[0] >= 5 and spread[1] >= 5, spread
    finally:
        for proc in brokers:
            stop(proc)
