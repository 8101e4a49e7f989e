"""The ports the tests give their servers (pubsubtest.ports): outside the kernel's ephemeral range, so that the
outgoing connections the suites open by the thousand cannot take one between its choice and the server's bind.

The test starts 200 servers (redis-server and pubsub brokers, four at a time) while threads churn thousands of
outgoing loopback connections, and none fails to start."""

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pubsubtest.broker import Broker
from pubsubtest.ports import ephemeral_range, free_port
from pubsubtest.redis import RedisServer
from pubsubtest.wait import wait_until

SERVERS = 200
BROKERS = 20  # a pubsub broker takes ~0.5 s to start and stop, redis-server ~0.05 s
MIN_CHURN = 3000


def test_ports_lie_outside_the_ephemeral_range_and_are_never_handed_out_twice():
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high]


def _churn(port, stop, counts, i):
    """Opens and closes outgoing connections to `port` until `stop`: each takes an ephemeral port."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                counts[i] += 1
        except OSError:
            time.sleep(0.01)  # pacing: the listener's backlog is full, let it accept


def _accept(listener, stop):
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
            conn.close()
        except OSError:
            pass


def _start_and_stop(i):
    server = Broker() if i % (SERVERS // BROKERS) == 0 else RedisServer()
    try:
        server.start()
        return server.port
    finally:
        server.stop()


def test_two_hundred_servers_start_while_outgoing_connections_churn():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    stop = threading.Event()
    counts = [0] * 3
    threads = [threading.Thread(target=_accept, args=(listener, stop), daemon=True)]
    threads += [threading.Thread(target=_churn, args=(listener.getsockname()[1], stop, counts, i), daemon=True)
                for i in range(len(counts))]
    for t in threads:
        t.start()
    try:
        with ThreadPoolExecutor(max_workers=4) as ex:
            ports = list(ex.map(_start_and_stop, range(SERVERS)))
        # Churn on until thousands of connections have gone by (the servers may start faster than that).
        wait_until(lambda: sum(counts) >= MIN_CHURN, 20, 0.1, raises=False)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        listener.close()
    low, high = ephemeral_range()
    assert len(ports) == SERVERS
    assert not [p for p in ports if low <= p <= high]
    assert sum(counts) >= MIN_CHURN, f"only {sum(counts)} outgoing connections churned"
